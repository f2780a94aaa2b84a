"""pope-fast: fast POPE evaluation of vision-language models under every answer readout.

The card's four folders (readout/, engine/, kernels/, bench/) install as subpackages of one
namespace, ``pope_fast``, so they never clash with the PyPI packages called ``kernels`` or
``bench``; ``pope_fast/`` itself only holds the small public API and the click CLI.
"""
from setuptools import find_packages, setup

SUBPACKAGES = ("readout", "engine", "kernels", "bench")
# every package below the four folders too (engine/models/), named as it installs
PACKAGES = ["pope_fast"] + [f"pope_fast.{name}{'.' + sub if sub else ''}" for name in SUBPACKAGES
                            for sub in ["", *find_packages(where=name)]]

setup(
    name="pope-fast",
    version="0.1.0",
    description="Fast POPE evaluation of vision-language models under every answer-readout protocol",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir={"pope_fast": "pope_fast", **{f"pope_fast.{name}": name for name in SUBPACKAGES}},
    # Dependency policy (CONTRIBUTING.md, "Dependencies"): the packages whose behaviour the engine mirrors bit for bit
    # (transformers' classes and processors, its tokenizers, bitsandbytes' NF4, triton's kernels) carry the bounds
    # the suite has passed at, both ends; the rest a floor. constraints.txt pins the last green resolve, which
    # .ci/run and the README's commands install; moving a bound or a pin is a change with its own suite run.
    install_requires=[
        # torch is installed first by .ci/run and the README (a pinned CPU wheel); a bare range here
        # then installs nothing more instead of pulling a multi-GB CUDA build.
        "torch>=2.4",
        # the GPU kernels, and on a CPU the interpreter their tests run them in (3.6: the lent H200's, with torch
        # 2.11; 3.9: the CPU machines'); a CUDA torch brings the triton it was built with
        "triton>=3.6,<3.10",
        # 5.24 and 5.25 passed the suite; each release has moved a class or a processor the engine mirrors
        "transformers>=5.24,<5.26",
        "safetensors>=0.4",
        # NF4 exactly as transformers quantizes (the engine's own NF4 is checked against it; bench's reference)
        "bitsandbytes>=0.50,<0.51",
        "numpy>=1.24",
        "click>=8.1",
        "tokenizers>=0.23,<0.24",
        "pillow>=10",
        "tqdm>=4.60",
        # transformers needs it to place a bitsandbytes-quantized model (device_map), which the
        # benchmark's reference pipeline and the NF4 tests do.
        "accelerate>=1.0",
    ],
    extras_require={
        "parquet": ["pyarrow>=14"],  # lmms-lab/POPE parquet question files with embedded images
        "report": ["matplotlib>=3.7"],  # pope-fast report's figures
        # the tests exercise both extras (without them the parquet and report tests would skip), run on
        # every core (pytest-xdist, setup.cfg) and hold pyflakes' checks at zero findings (ruff's F rules). pytest 9.2
        # keeps a test's id where xdist 3.8 no longer writes its group (`--dist loadgroup` then silently spreads a
        # family over every worker, each building its checkpoints and oracles): below 9.2 until xdist follows
        "test": ["pytest>=8,<9.2", "pytest-xdist>=3.5", "pyarrow>=14", "matplotlib>=3.7", "ruff>=0.6"],
    },
    entry_points={"console_scripts": ["pope-fast=pope_fast.cli:main"]},
)
