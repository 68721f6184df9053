# test/fuzz/MlirFuzzers.cmake - the compiler's libFuzzer targets (docs/fuzzing.md).
#
# Included by the top-level CMakeLists.txt when BONSAI_BUILD_FUZZERS is on, after the dialects
# and tools, which it has built with the same instrumentation as the runtime's fuzzers
# (test/fuzz/CMakeLists.txt). Only what the two targets need is built: the dialect libraries,
# the importer's library and one pass, not the whole compiler.

# bonsai-fuzz-bonsai-ir: the parser, the op verifiers and bonsai-verify-model. The pass is
# compiled in from its source, which needs only its generated declarations: linking
# BonsaiTransforms would build every pass of the compiler for one.
add_executable(bonsai-fuzz-bonsai-ir
  ${CMAKE_CURRENT_LIST_DIR}/BonsaiIrFuzzer.cpp
  ${BONSAI_SOURCE_DIR}/lib/Transforms/VerifyModel.cpp)
add_dependencies(bonsai-fuzz-bonsai-ir BonsaiTransformsPassIncGen)
llvm_update_compile_flags(bonsai-fuzz-bonsai-ir)
target_link_libraries(bonsai-fuzz-bonsai-ir PRIVATE
  BonsaiDialect
  PlanDialect
  MLIRFuncDialect
  MLIRParser
  MLIRPass
  MLIRIR)

# bonsai-fuzz-hf-config: bonsai-import-hf's config reader and graph builder. The importer
# throws (LLVM_REQUIRES_EH, as the tool), and so does the harness's catch.
set(LLVM_REQUIRES_EH ON)
add_executable(bonsai-fuzz-hf-config ${CMAKE_CURRENT_LIST_DIR}/HfConfigFuzzer.cpp)
llvm_update_compile_flags(bonsai-fuzz-hf-config)
target_link_libraries(bonsai-fuzz-hf-config PRIVATE
  BonsaiImport
  BonsaiDialect
  MLIRFuncDialect
  MLIRIR)
unset(LLVM_REQUIRES_EH)

foreach(target bonsai-fuzz-bonsai-ir bonsai-fuzz-hf-config)
  target_link_options(${target} PRIVATE -fsanitize=fuzzer)
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  add_dependencies(bonsai-fuzzers ${target})
endforeach()
