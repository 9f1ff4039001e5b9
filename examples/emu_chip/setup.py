"""Builds the device emulation's C++ library, ``torch_emu._emu_device``, against the installed
torch (hence ``pip install --no-build-isolation``). Everything else is in pyproject.toml."""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    # -O0: the library only wraps ATen calls, so its build time matters more than its speed.
    ext_modules=[CppExtension("torch_emu._emu_device", ["torch_emu/emu_device.cpp"],
                              extra_compile_args=["-O0", "-g0"])],
    # One source file: ninja would gain nothing, and a CI machine may not have it.
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
