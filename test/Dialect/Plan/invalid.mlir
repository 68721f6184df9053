// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// Arena alignment must be a power of two.
bonsai_plan.step @s attributes {target = "cpu"} {
  // expected-error @+1 {{alignment must be a power of two, got 48}}
  bonsai_plan.arena @a step device size 0 {alignment = 48 : i64}
}

// -----

// Arena sizes are non-negative.
bonsai_plan.step @s attributes {target = "cpu"} {
  // expected-error @+1 {{size must be non-negative, got -1}}
  bonsai_plan.arena @a step device size -1
}

// -----

// A buffer names an arena of its step.
bonsai_plan.step @s attributes {target = "cpu"} {
  // expected-error @+1 {{'@nowhere' does not name an arena of this step}}
  %b = bonsai_plan.buffer @nowhere activation "b" : memref<4xf32>
}

// -----

// Parameters persist across steps.
bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 1024
  // expected-error @+1 {{a parameter must live in a persistent arena; 'a' is per-step}}
  %b = bonsai_plan.buffer @a parameter "w" : memref<4xf32>
}

// -----

// Offsets respect the arena's alignment.
bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 1024
  // expected-error @+1 {{offset 16 is not a multiple of arena 'a' alignment 256}}
  %b = bonsai_plan.buffer @a[16] activation "b" : memref<4xf32>
}

// -----

// A placed buffer fits in its arena.
bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  // expected-error @+1 {{bytes [256, 272) exceed arena 'a' of 256 bytes}}
  %b = bonsai_plan.buffer @a[256] activation "b" : memref<4xf32>
}

// -----

// Negative offsets.
bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  // expected-error @+1 {{offset must be non-negative, got -256}}
  %b = bonsai_plan.buffer @a[-256] activation "b" : memref<4xf32>
}

// -----

// Inputs, and only inputs, carry an input_index.
bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  // expected-error @+1 {{an input buffer needs an input_index}}
  %b = bonsai_plan.buffer @a input "ids" : memref<4xi32>
}

// -----

bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  // expected-error @+1 {{only input buffers have an input_index}}
  %b = bonsai_plan.buffer @a activation "h" {input_index = 0 : i64} : memref<4xi32>
}

// -----

bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  // expected-error @+1 {{only parameters can be trainable}}
  %b = bonsai_plan.buffer @a activation "h" trainable : memref<4xf32>
}

// -----

// Views keep bytes and element type.
bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  %b = bonsai_plan.buffer @a activation "h" : memref<4x4xf32>
  // expected-error @+1 {{views 64 bytes as 32}}
  %v = bonsai_plan.view %b : memref<4x4xf32> to memref<8xf32>
}

// -----

bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  %b = bonsai_plan.buffer @a activation "h" : memref<4x4xf32>
  // expected-error @+1 {{element type changes from 'f32' to 'i32'}}
  %v = bonsai_plan.view %b : memref<4x4xf32> to memref<16xi32>
}

// -----

// A launch writes something.
bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  %b = bonsai_plan.buffer @a activation "h" : memref<4xf32>
  // expected-error @+1 {{kernel 'silu' writes no buffer}}
  bonsai_plan.launch "silu" ins(%b : memref<4xf32>) outs()
}

// -----

bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  %b = bonsai_plan.buffer @a activation "h" : memref<4xf32>
  // expected-error @+1 {{kernel name must not be empty}}
  bonsai_plan.launch "" ins(%b : memref<4xf32>) outs(%b : memref<4xf32>)
}

// -----

bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  %b = bonsai_plan.buffer @a activation "h" : memref<4xf32>
  // expected-error @+1 {{stream must be non-negative, got -1}}
  bonsai_plan.launch "silu" ins(%b : memref<4xf32>) outs(%b : memref<4xf32>) {stream = -1 : i64}
}

// -----

// Copies move equal byte counts.
bonsai_plan.step @s attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 256
  %b = bonsai_plan.buffer @a activation "h" : memref<4xf32>
  %c = bonsai_plan.buffer @a activation "c" : memref<8xf32>
  // expected-error @+1 {{copies 16 bytes into 32}}
  bonsai_plan.copy %b to %c stream 1 : memref<4xf32>, memref<8xf32>
}

// -----

// A step holds only plan ops.
bonsai_plan.step @s attributes {target = "cpu"} {
  // expected-error @+1 {{is not a bonsai_plan op; a step holds only plan ops}}
  func.func private @f()
}
