// RUN: bonsai-opt --bonsai-lower-to-plan %s -split-input-file -verify-diagnostics

// expected-error @+1 {{no model function to lower: no func.func declares a bonsai.param}}
module {
  func.func @not_a_model(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
