// bonsai-remat's errors: each names the cause.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: bonsai-opt --bonsai-remat=policy=full %t/forward-only.mlir -verify-diagnostics -o /dev/null
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat=policy=auto %t/no-budget.mlir -verify-diagnostics -o /dev/null
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat=policy=partial %t/no-budget.mlir -o /dev/null 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat="device-memory=1000000 search=random" %t/no-budget.mlir -o /dev/null 2>&1 | FileCheck %s --check-prefix=SEARCH
// RUN: printf 'bonsai.recipe @r {\n  bonsai.optimizer "adamw" lr 1.000000e-03\n}\n' > %t/recipe.mlir
// RUN: cat %bonsai_src/examples/models/tiny_llama.mlir %t/recipe.mlir > %t/tiny_llama.mlir
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat="device-memory=4000000 search=exhaustive" %t/tiny_llama.mlir -o /dev/null 2>&1 | FileCheck %s --check-prefix=EXHAUSTIVE

// POLICY: error: unknown remat policy 'partial'; expected one of: none, full, selective, auto
// SEARCH: error: unknown remat search 'random'; expected greedy, exhaustive or compare
// EXHAUSTIVE: error: search=exhaustive tries every subset of the 33 candidate tensors; it is limited to 24 (use search=greedy)

//--- forward-only.mlir
// Remat works on the joint forward+backward graph.
// expected-error @below {{bonsai-remat works on the joint forward+backward graph, but @forward has no backward op: run bonsai-autodiff first}}
func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %w = bonsai.param "lm_head" trainable : tensor<16x8xf32>
  %e = bonsai.param "embed" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %e, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %y = bonsai.linear %h, %w : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %y, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

//--- no-budget.mlir
// Policy auto (the option here; a recipe's bonsai.remat "auto" is refused by the recipe's
// verifier without a target device_memory) with no budget anywhere.
// expected-error @below {{remat policy 'auto' fits the plan to a memory budget, and there is none: give device-memory, or a recipe target with device_memory}}
func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %w = bonsai.param "lm_head" trainable : tensor<16x8xf32>
  %e = bonsai.param "embed" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %e, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %y = bonsai.linear %h, %w : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %y, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
}
