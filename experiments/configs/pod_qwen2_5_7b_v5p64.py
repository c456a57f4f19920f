"""Qwen2.5-7B on a TPU v5p-64 pod slice (32 chips, 95 GiB each): WebShop trees, BPO.

Layout: FSDP over 8 chips x tensor parallelism over 4 (28 query heads and 4 KV heads split
4 ways, parameters and optimizer state sharded 32 ways). Parameters are bfloat16 with a float32
master copy and float32 Adam moments in the optimizer state; each layer is rematerialised and
the layers run as one scan (compile time independent of depth). 32 tasks x 2 trees = 64 packed
rows of up to 16384 tokens per update, in 8 micro-batches (one row per FSDP group at a time);
the sampler decodes up to 64 x 4 leaves = 256 rows with 4608 cache slots each.

Check that it compiles and fits before booking the pod (32 fake CPU devices, abstract arrays:
no 7B weights are made; about a minute):

    python experiments/run.py --config=experiments/configs/pod_qwen2_5_7b_v5p64.py --dry_run

It compiles the loop's own train step, sampler and reshard and prints their per-device memory
(README.md, "Pods"). With `--config.model.checkpoint=DIR` it reads DIR's config.json as the run
does and checks it against the preset.

On the pod, every host (8 of them) runs the same command with its own process id, the
coordinator being host 0's address; DIR, the HF directory of Qwen2.5-7B(-Instruct), and the
workdir are directories every host sees:

    python experiments/run.py --config=experiments/configs/pod_qwen2_5_7b_v5p64.py \\
      --config.model.checkpoint=DIR --workdir=WORKDIR \\
      --config.scale.distributed.coordinator_address=HOST0:8476 \\
      --config.scale.distributed.process_id=$HOST_INDEX
"""

from experiments.configs import base
from experiments.configs import webshop


def get_config(arg=None):
  # v5p-64: 32 chips on 8 hosts of 4.
  config = base.pod(webshop.get_config(), model_preset="qwen2_5_7b", chip="v5p", fsdp=8, tensor=4,
                    hosts=8, tasks_per_iteration=32, max_tree_tokens=16384, max_length=4608,
                    micro_batches=8)
  return base.variant(config, arg)
