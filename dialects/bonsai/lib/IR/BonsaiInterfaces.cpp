//===- BonsaiInterfaces.cpp - bonsai op interfaces -------------------------===//
//
// Definitions generated from BonsaiInterfaces.td.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Dialect/Bonsai/IR/BonsaiInterfaces.h"

#include "bonsai/Dialect/Bonsai/IR/BonsaiInterfaces.cpp.inc"
