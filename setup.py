"""Packaging for gossip: a decentralized gossip / allreduce runtime for data-parallel training."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

setup(
    name="gossip",
    version="0.1.0",
    description=("Decentralized gossip and allreduce runtime for distributed deep learning over "
                 "ZeroMQ"),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=find_packages(include=["gossip", "gossip.*", "collectives", "collectives.*",
                                    "topologies", "topologies.*"]),
    # PEP 561: the packages are typed (checked with mypy: pyproject.toml's [tool.mypy]).
    package_data={"gossip": ["py.typed"], "collectives": ["py.typed"],
                  "topologies": ["py.typed"]},
    install_requires=[
        "numpy>=1.23",
        "pyzmq>=25",
        "msgpack>=1.0",
        # Snapshot digests (state transfer, checkpoints): XXH3-64 of each 4 MiB piece.
        "xxhash>=3.0",
    ],
    extras_require={
        # torch only for torch users (tensors, DistributedOptimizer, the c10d backend, the
        # demo): a numpy-only peer never imports it. Any torch works; CI and development pin
        # the CPU build in requirements-dev.txt.
        "torch": ["torch>=2.0"],
        "cuda": ["cupy-cuda12x>=13"],
        "demo": ["torch>=2.0", "scikit-learn>=1.2", "matplotlib>=3.6", "tqdm>=4.60"],
        # The metrics' TensorBoard scalars (GOSSIP_TENSORBOARD); prometheus-client only as the
        # tests' parser of the text the exporter serves (the exporter writes it itself).
        "metrics": ["prometheus-client>=0.17", "tensorboard>=2.12"],
        # gossip.lightning (GossipStrategy) and gossip.ray (Ray Train's TorchTrainer).
        "lightning": ["torch>=2.0", "lightning>=2.4"],
        "ray": ["torch>=2.0", "ray[train]>=2.40"],
        "test": [
            "pytest>=7",
            "prometheus-client>=0.17",
            "tensorboard>=2.12",
            "pytest-timeout>=2.1",
            "pytest-xdist>=3.5",
            "hypothesis>=6.70",
            "networkx>=3",
            "psutil>=5.9",
        ],
    },
    entry_points={
        "console_scripts": ["gossip=gossip.cli:main"],
        "pytest11": ["gossip = gossip.pytest_plugin"],
        # torch calls it at the end of `import torch` (its out-of-tree backend autoload):
        # "gossip" is a torch.distributed backend in every process, gossip imported or not.
        "torch.backends": ["gossip = gossip.torch_import_hook:autoload"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
    ],
)
