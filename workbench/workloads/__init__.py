"""What a run trains: models, architectures, data, datasets, pipeline stages."""
