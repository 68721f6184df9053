# Precompiled MLIR and LLVM headers for the compiler's own sources.
#
# Nearly every source file of dialects/, lib/ and tools/ includes the same MLIR and LLVM
# headers (op definitions, builders, pattern rewriting, passes): with GCC at -O3 they took 9.4
# of InsertLora.cpp's 14.8 s, and about 6 s of each of ~70 files (~400 s of a 2-core CI
# machine's 2,100 s build). They are compiled once, by PlanDialect (which everything else
# depends on), and reused by every target built with the same flags.
#
# Only headers from outside the tree are listed, so that editing Bonsai's own headers never
# rebuilds the precompiled one. A precompiled header can hide a missing #include: configure
# with -DBONSAI_PRECOMPILED_HEADERS=OFF to build without it (the fuzz build does,
# scripts/test-fuzz.sh, so that the dialects and the importer are checked without it in CI).

option(BONSAI_PRECOMPILED_HEADERS
  "Precompile the MLIR and LLVM headers the compiler's sources share" ON)

set(BONSAI_PRECOMPILED_MLIR_HEADERS
  <llvm/ADT/DenseMap.h>
  <llvm/ADT/DenseSet.h>
  <llvm/ADT/MapVector.h>
  <llvm/ADT/STLExtras.h>
  <llvm/ADT/SetVector.h>
  <llvm/ADT/SmallPtrSet.h>
  <llvm/ADT/SmallVector.h>
  <llvm/ADT/StringMap.h>
  <llvm/ADT/StringSet.h>
  <llvm/ADT/TypeSwitch.h>
  <llvm/Support/Format.h>
  <llvm/Support/raw_ostream.h>
  <mlir/Bytecode/BytecodeOpInterface.h>
  <mlir/Dialect/Arith/IR/Arith.h>
  <mlir/Dialect/Func/IR/FuncOps.h>
  <mlir/Dialect/Math/IR/Math.h>
  <mlir/IR/Builders.h>
  <mlir/IR/BuiltinAttributes.h>
  <mlir/IR/BuiltinOps.h>
  <mlir/IR/BuiltinTypes.h>
  <mlir/IR/Dialect.h>
  <mlir/IR/IRMapping.h>
  <mlir/IR/OpDefinition.h>
  <mlir/IR/OpImplementation.h>
  <mlir/IR/PatternMatch.h>
  <mlir/IR/SymbolTable.h>
  <mlir/Interfaces/FunctionInterfaces.h>
  <mlir/Interfaces/SideEffectInterfaces.h>
  <mlir/Interfaces/ViewLikeInterface.h>
  <mlir/Pass/Pass.h>
  <mlir/Pass/PassManager.h>
  <mlir/Transforms/GreedyPatternRewriteDriver.h>)

# bonsai_precompile_mlir_headers(OWNER TARGET...): OWNER (the target whose sources compile
# first) builds the precompiled header; each TARGET reuses it. All must share OWNER's compile
# flags: BonsaiImport, built with exceptions, is not among them.
function(bonsai_precompile_mlir_headers owner)
  if(NOT BONSAI_PRECOMPILED_HEADERS)
    return()
  endif()
  target_precompile_headers(${owner} PRIVATE ${BONSAI_PRECOMPILED_MLIR_HEADERS})
  foreach(target ${ARGN})
    target_precompile_headers(${target} REUSE_FROM ${owner})
  endforeach()
endfunction()
