"""Build and install torchrec_ascend.

The C++ CPU kernels in csrc/ are compiled into ``torchrec_ascend._C`` through
``torch.utils.cpp_extension`` (OpenMP, -O3).  Build without isolation so the extension links
against the torch already installed: ``pip install --no-build-isolation -e .``.
Set ``TORCHREC_ASCEND_NO_EXT=1`` to skip the extension (the reference backend is used instead).
"""

import glob
import os

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _ext_modules():
    if os.environ.get("TORCHREC_ASCEND_NO_EXT") == "1":
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    sources = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "*.cpp")))
    ext = CppExtension(
        name="torchrec_ascend._C",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args=["-O3", "-g0", "-fopenmp", "-std=c++17"],
        extra_link_args=["-fopenmp"],
    )
    # test infrastructure: the simulated NPU (PrivateUse1 over host memory), loaded only by
    # torchrec_ascend.testing.simulated_npu.enable()
    simnpu_sources = sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "simnpu", "*.cpp"))
    )
    simnpu = CppExtension(
        name="torchrec_ascend._simnpu",
        sources=simnpu_sources,
        include_dirs=[os.path.join(ROOT, "csrc", "simnpu")],
        extra_compile_args=["-O2", "-g0"],
    )
    return [ext, simnpu], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _ext_modules()

setup(
    name="torchrec_ascend",
    version="0.1.0",
    description="TorchRec on Ascend NPUs (and CPU/CUDA): jagged ops, HSTU, sharding planner, "
    "negative sampling -- the TurboGR system",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    if os.path.exists(os.path.join(ROOT, "README.md")) else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["torchrec_ascend", "torchrec_ascend.*"]),
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    install_requires=["torch>=2.7", "numpy", "tqdm"],
    extras_require={
        # TorchRec stack on CPU (the Makefile installs torchrec --no-deps: its metadata wants the
        # CUDA fbgemm-gpu build)
        "cpu": ["fbgemm-gpu-cpu==1.8.0", "tensordict", "torchmetrics==1.0.3", "pyre-extensions",
                "iopath", "pyarrow", "tensorboard", "matplotlib"],
        # Ascend: torch-npu (needs Huawei CANN) + triton-ascend (ships its own top-level `triton`
        # package: never install it beside `triton`).  fbgemm-ascend is used where it loads.
        "npu": ["torch-npu==2.13.0", "triton-ascend"],
        "cuda": ["fbgemm-gpu==1.8.0", "triton"],
        "test": ["pytest", "pytest-timeout", "hypothesis"],
    },
    zip_safe=False,
)
