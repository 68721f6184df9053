//===- bonsai-opt.cpp - Run any Bonsai pass on any bonsai IR --------------===//
//
// The inspection and test tool: parses bonsai IR, runs the passes named on the command line and
// prints the result. Registers Bonsai's dialects and passes, not all of upstream.
//
//===----------------------------------------------------------------------===//

#include "bonsai/InitAll.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  mlir::bonsai::registerAllDialects(registry);
  mlir::bonsai::registerAllPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "Bonsai optimizer driver\n", registry));
}
