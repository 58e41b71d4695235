# -*- Python -*-
# lit configuration for the actplace compiler tests.
import os
import re

import lit.formats
from lit.llvm import llvm_config

config.name = "actplace"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.actplace_obj_root, "test")
# unit/ holds gtest sources, e2e/ is driven by ctest directly.
config.excludes = ["unit", "e2e", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]

config.substitutions.append(("%models", os.path.join(config.actplace_src_root, "models")))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))
# --version tests: the release (project VERSION) and the compiler-runtime ABI
# version runtime/abi.h declares.
config.substitutions.append(("%actplace_version", config.actplace_version))
with open(os.path.join(config.actplace_src_root, "runtime", "abi.h")) as abi_header:
    abi_match = re.search(r"^#define AP_ABI_VERSION (\d+)", abi_header.read(), re.M)
config.substitutions.append(("%actplace_abi", abi_match.group(1) if abi_match else "?"))

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
tool_dirs = [config.actplace_tools_dir, config.llvm_tools_dir]
llvm_config.add_tool_substitutions(["actplace-opt", "actplace-import", "actplace-translate", "actplace-compile", "actplace-ckpt"], tool_dirs)
