# -*- Python -*-
# lit configuration for the actplace compiler tests.
import os

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

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
tool_dirs = [config.actplace_tools_dir, config.llvm_tools_dir]
llvm_config.add_tool_substitutions(["actplace-opt", "actplace-import", "actplace-translate", "actplace-compile"], tool_dirs)
