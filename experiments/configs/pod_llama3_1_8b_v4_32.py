"""Llama-3.1-8B on a TPU v4-32 pod slice (16 chips, 32 GiB each): WebShop trees, BPO.

Layout: FSDP over 4 chips x tensor parallelism over 4 (32 query and 8 KV heads, the MLP and the
vocabulary split 4 ways; parameters and optimizer state sharded 16 ways). Parameters are
bfloat16 with a float32 master copy and float32 Adam moments; each layer is rematerialised and
the layers run as one scan. 8 tasks x 2 trees = 16 packed rows of up to 4096 tokens per update
in 4 micro-batches (one row per FSDP group at a time); the sampler decodes up to 16 x 4 leaves
= 64 rows with 4096 cache slots each. Episodes are cut at 8 turns so one path (at most 3603
tokens) fits the context. 32 GiB per chip is what bounds the row length: dense attention and
the vocabulary projection grow with the tokens per row.

The dry run (16 fake CPU devices, abstract arrays; about a minute) prints the per-device
memory of the loop's train step, sampler and reshard (README.md, "Pods"):

    python experiments/run.py --config=experiments/configs/pod_llama3_1_8b_v4_32.py --dry_run

On the pod (4 hosts of 4 chips), every host runs run.py with its own process id, the
coordinator being host 0's address; DIR, the HF directory of Llama-3.1-8B(-Instruct), and the
workdir are directories every host sees:

    python experiments/run.py --config=experiments/configs/pod_llama3_1_8b_v4_32.py \\
      --config.model.checkpoint=DIR --workdir=WORKDIR \\
      --config.scale.distributed.coordinator_address=HOST0:8476 \\
      --config.scale.distributed.process_id=$HOST_INDEX
"""

from experiments.configs import base
from experiments.configs import webshop


def get_config(arg=None):
  c = webshop.get_config()
  c.env.max_turns = 8
  c.env.options.max_steps = 8
  # v4-32: 16 chips on 4 hosts of 4.
  config = base.pod(c, model_preset="llama3_1_8b", chip="v4", fsdp=4, tensor=4, hosts=4,
                    tasks_per_iteration=8, max_tree_tokens=4096, max_length=4096, micro_batches=4)
  return base.variant(config, arg)
