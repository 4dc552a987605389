"""What a run trains.

- :mod:`.registry` — each model and dataset one registered entry, read by everything that names them;
- :mod:`.models` — building the run's model; cutting a model into pipeline stages;
- :mod:`.architectures` — the seed papers' CNNs (LeNet-5, AlexNet, VGG-11, ResNet-20/18) with batch norm;
- :mod:`.data` — datasets by name, the global batch sequence; :mod:`.datasets` — image datasets and their readers;
- :mod:`.dataset_files` — what the configuration checks about a dataset's files (no torch);
- :mod:`.stages` — where a pipeline or hybrid run's model is cut, and what each rank's stage holds;
- :mod:`.apoptosis` — adaptive neuron apoptosis: the rule and the model surgery.
"""
