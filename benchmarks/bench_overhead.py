"""No-fault step time of the workbench vs plain torch DDP (gloo, default group), same model, data and world.

Both sides time the same thing on rank 0: from taking the step's shard to the end of the optimizer step
(forward, backward, gradient allreduce, update). Rounds alternate DDP and workbench so machine noise hits both.
DDP runs with its defaults (``broadcast_buffers=True``: rank 0's batch-norm buffers are broadcast before every
forward); the workbench averages them inside its first gradient bucket (docs: Parallel modes).

Prints one JSON line: per model, its parameters and both median step times and their ratio.
Usage: python benchmarks/bench_overhead.py [--model mlp resnet20 ...] [--dataset synthetic_image]
       [--batch-size 128] [--world-size 2] [--steps 400] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import workbench
from workbench.base.processes import RANK_ENV_DEFAULTS
from workbench.config.run import RunConfig
from workbench.workloads.data import BatchSequence, load_dataset, shard
from workbench.workloads.models import build_model

WARMUP = 50


def ddp_rank(rank: int, world: int, port: int, config: RunConfig, queue: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    data = load_dataset(config)
    batches = BatchSequence(len(data.y_train), config.batch_size, config.seed)
    model = torch.nn.parallel.DistributedDataParallel(build_model(config, data.input_shape, data.num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    times = []
    for step in range(config.steps):
        started = time.perf_counter()
        idx = torch.from_numpy(shard(batches(step), rank, world))
        optimizer.zero_grad(set_to_none=True)
        x, y = data.train_batch(idx, step)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    if rank == 0:
        queue.put(times[WARMUP:])
    dist.destroy_process_group()


def ddp_step_times(config: RunConfig) -> list[float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=ddp_rank, args=(r, config.world_size, port, config, queue))
             for r in range(config.world_size)]
    for p in procs:
        p.start()
    times = queue.get(timeout=600)
    for p in procs:
        p.join(60)
    return times


def workbench_step_times(config: RunConfig) -> list[float]:
    result = workbench.run(config)
    if not result.completed:
        sys.exit(f"workbench run failed: {result.summary['reason']}")
    return [row["step_time"] for row in result.metrics][WARMUP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", nargs="+", default=["mlp"], help="one or more models, each measured alike")
    parser.add_argument("--dataset", default="digits", help="e.g. synthetic_image (CIFAR-shaped) for the CNNs")
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name, value in RANK_ENV_DEFAULTS.items():  # DDP's ranks get the memory setting the workbench's ranks get
        os.environ.setdefault(name, value)
    rows = []
    for model in args.model:
        config = RunConfig(world_size=args.world_size, steps=args.steps, model=model, dataset=args.dataset,
                           batch_size=args.batch_size, eval_interval=args.steps)
        data = load_dataset(config)
        parameters = sum(p.numel() for p in build_model(config, data.input_shape, data.num_classes).parameters())
        ddp, ours = [], []
        for _ in range(args.rounds):
            ddp += ddp_step_times(config)
            ours += workbench_step_times(config)
        ddp_median, ours_median = statistics.median(ddp), statistics.median(ours)
        rows.append({"model": model, "parameters": parameters, "ddp_median_step_ms": round(ddp_median * 1e3, 3),
                     "workbench_median_step_ms": round(ours_median * 1e3, 3),
                     "ratio": round(ours_median / ddp_median, 3)})
        print(f"[overhead] {rows[-1]}", file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "overhead", "dataset": args.dataset, "batch_size": args.batch_size,
                      "world_size": args.world_size, "steps": args.steps, "rounds": args.rounds, "models": rows}))


if __name__ == "__main__":
    main()
