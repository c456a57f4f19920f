"""bpo_jax: Branching Policy Optimization for LLM agents in snapshot-able sandboxes."""

from setuptools import find_packages, setup

# The pure core (tree, estimators, branching, losses, packing) needs only these three.
CORE = ["jax>=0.7", "numpy>=1.26", "chex>=0.1.89"]
# The policy, the training loop and the experiments.
FULL = [
    "flax>=0.12",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "transformers>=4.50",
    "safetensors>=0.4",
    "jinja2>=3.1",
    "gymnasium>=1.0",
    "absl-py>=2.1",
    "ml-collections>=1.0",
    "tensorboard>=2.15",
    "tokenizers>=0.20",  # the word-level tokenizer of the built-in world
    "tqdm>=4.60",  # the training loop's progress bar
]
TEST = [
    "pytest>=8",
    "pytest-xdist>=3.6",  # two workers, one test file each at a time, in the collected order
    "hypothesis>=6.100",
    # The PyTorch reference for parity tests; 2.13.0 is the CPU build the test machines keep on disk.
    "torch==2.13.0",
    "matplotlib>=3.8",  # experiments/compare.py's plots
]
# experiments/compare.py: the comparison's plots.
RESULTS = ["matplotlib>=3.8"]
# Sandboxes as Ray actors on the CPU nodes of a cluster (`env.pool.backend = "ray"`).
RAY = ["ray==2.60.0"]

# One extra per environment package. Each line is added by the environment's module; the test
# extra installs all of them so CI exercises every environment and its install step.
ENVIRONMENT_EXTRAS = {
    "textworld": ["textworld==1.7.0"],
    "webshop": ["bm25s>=0.2", "PyStemmer>=2.2", "rapidfuzz>=3.0"],
    "swe": ["swebench==5.0.2"],
    # ALFWorld's text engine: alfworld pulls textworld[pddl] (tatsu, and fast-downward-textworld,
    # built from source with cmake and a C++ compiler). No pins that clash with jax/numpy 2/torch.
    "alfworld": ["alfworld==0.4.2"],
}

setup(
    name="bpo_jax",
    version="0.1.0",
    description="Branching Policy Optimization (BPO) for LLM agents in JAX/Flax.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["bpo_jax", "bpo_jax.*"]),
    # Data shipped inside the package: the SWE tasks (instance JSON and their repositories).
    package_data={"bpo_jax.sandboxes.swe": ["tasks/*/*", "tasks/*/*/*", "tasks/*/*/*/*"]},
    install_requires=CORE + FULL,
    extras_require={
        "test": TEST + RAY + sorted({req for reqs in ENVIRONMENT_EXTRAS.values()
                                     for req in reqs}),
        "results": RESULTS,
        "ray": RAY,
        **ENVIRONMENT_EXTRAS,
    },
    license="Apache-2.0",
)
