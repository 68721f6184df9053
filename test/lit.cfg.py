# test/lit.cfg.py - lit configuration of Bonsai's FileCheck tests.
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "Bonsai"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.bonsai_obj_root, "test")

config.environment["FILECHECK_OPTS"] = "-enable-var-scope --allow-unused-prefixes=false"
config.substitutions.append(("%bonsai_src", config.bonsai_src_root))
config.substitutions.append(("%python", "python3"))

llvm_config.with_system_environment(["HOME", "TMP", "TEMP"])
llvm_config.use_default_substitutions()
tool_dirs = [os.path.join(config.bonsai_obj_root, "bin"), config.llvm_tools_dir]
llvm_config.add_tool_substitutions(["bonsai-opt", "bonsai-compile", "bonsai-run", "bonsai-import-hf", "bonsai-tokenize", "bonsai-plot", "FileCheck", "not", "split-file"], tool_dirs)
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
# The plot test renders bonsai-plot's SVG with rsvg-convert (librsvg2-bin, installed by
# scripts/install-deps.sh): a missing renderer fails that test, it is not skipped.
llvm_config.with_environment("PATH", os.path.join(config.bonsai_obj_root, "bin"), append_path=True)
