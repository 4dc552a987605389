"""What each :class:`~workbench.config.run.RunConfig` field means, written once: its help, its allowed values and its
command-line flag. ``workbench run``'s flags (:func:`run_flags`) and the settings table of docs/settings.md
(``tools/gen_settings.py``) are generated from :data:`SETTINGS`; the allowed values are the tuples
:mod:`workbench.config.run` checks against, imported, not restated.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from workbench.config import devices
from workbench.config import run as config
from workbench.config.resize_rule import RULES as RESIZE_RULES
from workbench.faults import kinds
from workbench.faults.slow import STRAGGLER_RESPONSES
from workbench.strategies.peers import PEER_STRATEGIES
from workbench.workloads import registry


@dataclass(frozen=True)
class Setting:
    """One field's documentation. ``{choices}`` in ``help`` stands where the allowed values are listed."""

    help: str
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()  # a function: a registry's, read when asked
    flag: str | None = ""  # "": --the-field-name; None: no flag (a YAML key and a keyword argument only)
    parse: Callable[[str], Any] | None = None  # the flag's argparse type; default: from the field's annotation
    repeat: bool = False  # the flag may be given again, each time adding an entry
    docs: str = ""  # docs/settings.md only: Markdown after the help (links to more)

    @property
    def allowed(self) -> tuple[str, ...]:
        """The allowed values as they stand now (a model or dataset a notebook registered included)."""
        return self.choices() if callable(self.choices) else self.choices


def _int_list(what: str, example: str) -> Callable[[str], list[int]]:
    """A flag's comma-separated integers; anything else is one line saying what a list looks like."""
    def int_list(text: str) -> list[int]:
        try:
            return [int(item) for item in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: {what}, comma-separated integers, e.g. "
                                              f"{example}") from None
    return int_list


_FAULTS = " | ".join([*kinds.GRAMMAR, f"{kinds.RANDOM}:mtbf_steps=M,dist={'|'.join(config.DISTRIBUTIONS)},shape=K,"
                       "seed=S,max=F[,kind=slow,factor=F,duration=D]"])  # each kind's forms: its object's
_RECOVERY = "[Permanent faults](permanent-faults.md#recovery-strategies)"
_MODES = "[Parallel modes](parallel-modes.md)"

SETTINGS: dict[str, Setting] = {
    "world_size": Setting(f"number of ranks (1..{config.MAX_WORLD_SIZE})"),
    "steps": Setting("training steps"),
    "batch_size": Setting("global mini-batch, split over the live ranks"),
    "lr": Setting("learning rate"),
    "lr_schedule": Setting("the learning rate over the run: {choices}; cosine: from lr at step 0 to 0 at the last "
                           "step; step: lr/10 from half the run, lr/100 from three quarters", config.LR_SCHEDULES,
                           docs="[The learning-rate schedule](#the-learning-rate-schedule)"),
    "optimizer": Setting("the optimizer: {choices}", config.OPTIMIZERS),
    "momentum": Setting("momentum of sgd, in [0, 1)", flag=None),
    "model": Setting("{choices}, or package.module:callable returning an nn.Module (it may take input_shape, "
                     "num_classes)", registry.model_names, docs="[Models](#models)"),
    "hidden": Setting("MLP hidden widths, e.g. 128,64", parse=_int_list("the hidden layers' widths", "128,64")),
    "width": Setting("vgg11, alexnet: multiplier of every convolution's channels (0 < width <= 4)"),
    "dataset": Setting("{choices}, or package.module:callable returning (x_train, y_train, x_test, y_test); "
                       "synthetic_image is 3x32x32, 10 classes; the files on disk: CIFAR binary version (cifar10, "
                       "cifar100), IDX files, .gz or not (mnist, fashion_mnist), class/*.png (imagefolder)",
                       registry.dataset_forms, docs="[Datasets](#datasets)"),
    "synthetic_size": Setting("training samples of synthetic and synthetic_image"),
    "augment": Setting("image datasets: {choices}; crop_flip is a 4-pixel padded random crop + horizontal flip, "
                       "decided per seed, step and sample: the same whatever the world size", config.AUGMENTS,
                       docs="[Augmentation](#augmentation)"),
    "seed": Setting("seed of model initialisation and data order (runs are deterministic given the seed)"),
    "strategy": Setting(f"recovery: {{choices}} (of which {', '.join(PEER_STRATEGIES)} are the peer systems)",
                        config.STRATEGIES,
                        docs=f"{_RECOVERY}, [Adding a strategy](strategies.md), "
                        "[Peers as strategies](peers.md#torchft-and-torchrun), "
                        "[ULFM](peers.md#ulfm-what-the-mpi-layer-gives)"),
    "regrow": Setting(f"replace dead ranks (with {', '.join(config.REGROW_STRATEGIES)})", docs=_RECOVERY),
    "warm_spares": Setting("pre-started ranks that replace dead ones without start-up cost (default: 1 with regrow "
                           "or strategy reinit, else 0)"),
    "checkpoint_every": Setting("steps between snapshots (HDF5 or in memory)", docs=_RECOVERY),
    "resume": Setting("HDF5 checkpoint to start from"),
    "resume_verify": Setting("check a --resume checkpoint's checksums first (--no-verify, false: resume from it "
                             "even if they fail, for altered checkpoints)", flag="--no-verify"),
    "eval_interval": Setting("steps between test-set evaluations"),
    "detect": Setting("soft-error detectors, comma-separated: {choices}", config.DETECTORS,
                      docs="[Soft errors](soft-errors.md#detectors)"),
    "detect_every": Setting("steps between fingerprints and verified snapshots"),
    "guard_limit": Setting("guard detector: a |weight|, |gradient| or |loss| beyond this counts as corrupt",
                           flag=None),
    "spike_factor": Setting("spike detector: a loss this many times the recent median counts as a spike", flag=None),
    "faults": Setting(_FAULTS, flag="--fault", repeat=True,
                      docs="[Concepts](concepts.md#rank-numbers-and-faults), [Soft errors](soft-errors.md#live-flips)"),
    "parallelism": Setting("how training is spread over the ranks: {choices}; pipeline: a stage per rank, gossip: "
                           "GossipGraD, hybrid: replicated stages", config.PARALLELISMS, docs=_MODES),
    "micro_batches": Setting("pipeline/hybrid: micro-batches per step (GPipe)"),
    "pipeline_stages": Setting("hybrid: number of stages, each replicated over world/stages ranks (default 2); "
                               "pipeline: world_size"),
    "stage_cuts": Setting("pipeline/hybrid: index of the top-level module each stage after the first starts at, "
                          "e.g. 5,11 (default: balanced by measured time)",
                          parse=_int_list("the stages' first modules", "5,11"),
                          docs="[How stages are cut](#how-pipeline-stages-are-cut)"),
    "gossip_sync": Setting("gossip: blocking exchange after the update (default: overlapped with the step)"),
    "shuffle": Setting("gossip: {choices}; ring: samples move between neighbours, none: fixed local partitions",
                       config.SHUFFLES, docs=_MODES),
    "consensus_every": Setting("gossip: steps between consensus-distance measurements (a measurement only)"),
    "apoptosis": Setting("adaptive neuron apoptosis: on, off, or tol=T,window=W,delta=D[,grow=,shrink=,min=,lasso=,"
                         "gamma=,relative=,start=,until=,val=,fold=]", docs="[Neuron apoptosis](apoptosis.md)"),
    "flush_denormal": Setting("flush subnormal floats to zero on every rank (torch.set_flush_denormal); default: "
                              "where apoptosis is on", flag=None, docs="[Neuron apoptosis](apoptosis.md)"),
    "bucket_cap_mb": Setting("gradient bucket size in MB"),
    "buckets": Setting("gradient buckets per step (default 2), cut further where one exceeds the cap",
                       docs="two, so that `forward` differs from `shrink` on every model: [Permanent faults]"
                       "(permanent-faults.md)"),
    "heartbeat_timeout": Setting("seconds without heartbeat before a ready rank counts as frozen (start-up: "
                                 "startup_timeout)"),
    "progress_timeout": Setting("seconds with no step committed before the rank that holds the run up counts as "
                                "stalled and is killed (default: 20 times the slowest gap between two commits so "
                                "far, at least heartbeat_timeout)",
                                docs="[Stalls](permanent-faults.md#stalls-the-progress-watchdog)"),
    "straggler_response": Setting("what the straggler detector does with a rank whose step time is straggler_factor "
                                  "times the others' median over straggler_window steps: {choices}; off: no "
                                  "detector, flag: an event (the run tolerates it), drop: killed and recovered from "
                                  "like a failed rank (shrink goes on smaller; regrow, reinit and checkpoint_restart "
                                  "bring a replacement)", STRAGGLER_RESPONSES,
                                  docs="[Slow ranks](permanent-faults.md#slow-ranks-and-stragglers)"),
    "straggler_factor": Setting("how many times the others' median step time (a rank's own CPU per step) makes a "
                                "straggler (> 1)"),
    "straggler_window": Setting("steps over which the straggler detector takes each rank's median step time "
                                "(3..10000)"),
    "speed_probe": Setting("rank clock at this machine's reference speed: each rank probes its core's speed every "
                           "25 ms of its CPU (about 2 percent of wall time) and scales its CPU time by it",
                           docs="[Two clocks](concepts.md#two-clocks-wall-time-and-rank-time)"),
    "preempt_grace": Setting("seconds of notice an outside signal (notice_signals) gives a rank to leave at a step "
                             "boundary", docs="[Preemption](permanent-faults.md#preemption-with-notice)"),
    "notice_signals": Setting("signals a rank takes as a preemption notice, comma-separated: {choices} (SIGTERM "
                              "otherwise kills at once)", ("SIGUSR1", "SIGUSR2", "SIGTERM"),
                              docs="[Preemption](permanent-faults.md#preemption-with-notice)"),
    "resize_rule": Setting("the learning rate after a resize (resize:world=N, run.resize): {choices}; keep: the "
                           "global batch stays batch_size, split over the ranks, and so does lr; linear: each rank "
                           "(hybrid: each lane) keeps its batch, the global batch and lr scale with the world "
                           "(gossip: lr kept); a failure is no resize", RESIZE_RULES,
                           docs="[The learning-rate rule](permanent-faults.md#the-learning-rate-rule)"),
    "startup_timeout": Setting("seconds a rank may take to start and report ready before it counts as dead",
                               flag=None),
    "spawn": Setting("how ranks start: {choices}; template: forked by a rank template (milliseconds), fresh: a new "
                     "interpreter each (~1 s of torch import); a peer strategy's ranks always start fresh (its config "
                     "says so)", config.SPAWNS),
    "device": Setting("where ranks compute: {choices}; cuda: the ranks share this machine's GPUs round-robin and "
                      "exchange over gloo on CUDA tensors (parallelism data); auto: cuda where a GPU is usable, "
                      "else cpu", devices.DEVICES, docs="[GPU ranks](devices.md)"),
    "op_timeout": Setting("seconds a collective may take before the rank gives up on it", flag=None),
    "hosts": Setting("where the ranks run: hosts in order, the first this machine, each with its address, slots "
                     "and launch command; unset: every rank on this machine (command line: --hosts-file, --slurm)",
                     flag=None, docs="[Runs beyond one machine](sweeps-and-clusters.md#runs-beyond-one-machine)"),
    "bind": Setting("address the store and control server listen on (default 127.0.0.1, or the hosts file's "
                    "first host)"),
    "store_port": Setting("port of the store (default: a free one); ranks started elsewhere join it with "
                          "workbench rank --store ADDRESS:PORT"),
}


def help_text(name: str, markdown: bool = False) -> str:
    """Field ``name``'s help with its allowed values filled in (as code spans when ``markdown``)."""
    setting = SETTINGS[name]
    values = [f"`{c}`" if markdown else c for c in setting.allowed]
    return setting.help.format(choices=", ".join(values)) if setting.choices else setting.help


def flag_of(name: str) -> str | None:
    """Field ``name``'s ``workbench run`` flag, or None when it has none."""
    flag = SETTINGS[name].flag
    return "--" + name.replace("_", "-") if flag == "" else flag


_PARSE = {"int": int, "float": float, "str": str, "list[str]": str}  # list[str]: comma-separated, split by config


def run_flags() -> Iterator[tuple[str, dict[str, Any]]]:
    """``(flag, add_argument keywords)`` for every field with a flag, in field order. Each defaults to "not
    given" (argparse.SUPPRESS) so that a --config file fills the rest; choices are checked by RunConfig, which
    names the field and what is allowed, not by argparse."""
    for f in dataclasses.fields(config.RunConfig):
        setting, flag = SETTINGS[f.name], flag_of(f.name)
        if flag is None:
            continue
        options: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text(f.name)}
        kind = str(f.type).replace(" ", "").removesuffix("|None")
        if kind == "bool":
            options["action"] = "store_false" if f.default is True else "store_true"
        elif setting.repeat:
            options.update(action="append", help=options["help"] + " (repeatable)")
        else:
            options["type"] = setting.parse or _PARSE[kind]
        yield flag, options
