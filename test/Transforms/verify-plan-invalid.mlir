// RUN: bonsai-opt --bonsai-verify-plan %s -split-input-file -verify-diagnostics

// Planted overlap: %x and %y are both live at launch "g" and share bytes [256, 512).
bonsai_plan.step @overlap attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 1024
  %in = bonsai_plan.buffer @a[0] input "in" {input_index = 0 : i64} : memref<64xf32>
  %x = bonsai_plan.buffer @a[256] activation "x" : memref<64xf32>
  // expected-error @+1 {{buffer 'y' [256, 512) overlaps buffer 'x' [256, 512) in arena 'a' while both are live}}
  %y = bonsai_plan.buffer @a[256] activation "y" : memref<64xf32>
  bonsai_plan.launch "f" ins(%in : memref<64xf32>) outs(%x : memref<64xf32>)
  bonsai_plan.launch "g" ins(%in : memref<64xf32>) outs(%y : memref<64xf32>)
  bonsai_plan.launch "h" ins(%x, %y : memref<64xf32>, memref<64xf32>) outs(%in : memref<64xf32>)
}

// -----

// Persistent buffers are always live: parameters may never share bytes.
bonsai_plan.step @persistent attributes {target = "cpu"} {
  bonsai_plan.arena @w persistent device size 1024
  %p = bonsai_plan.buffer @w[0] parameter "p" : memref<128xf32>
  // expected-error @+1 {{buffer 'q' [256, 768) overlaps buffer 'p' [0, 512)}}
  %q = bonsai_plan.buffer @w[256] parameter "q" : memref<128xf32>
}

// -----

// Read before write.
bonsai_plan.step @uninitialized attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 1024
  %x = bonsai_plan.buffer @a[0] activation "x" : memref<128xf32>
  %y = bonsai_plan.buffer @a[512] activation "y" : memref<128xf32>
  // expected-error @+1 {{reads buffer 'x' before any op writes it}}
  bonsai_plan.launch "f" ins(%x : memref<128xf32>) outs(%y : memref<128xf32>)
}

// -----

// Unplaced buffers.
bonsai_plan.step @unplaced attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 1024
  // expected-error @+1 {{buffer 'x' has no offset}}
  %x = bonsai_plan.buffer @a input "x" {input_index = 0 : i64} : memref<128xf32>
}

// -----

// Buffers that are not live at the same time may share bytes: no error.
bonsai_plan.step @disjoint_in_time attributes {target = "cpu"} {
  bonsai_plan.arena @a step device size 1536
  %in = bonsai_plan.buffer @a[1024] input "in" {input_index = 0 : i64} : memref<128xf32>
  %x = bonsai_plan.buffer @a[0] activation "x" : memref<128xf32>
  %y = bonsai_plan.buffer @a[512] activation "y" : memref<128xf32>
  %z = bonsai_plan.buffer @a[0] activation "z" : memref<128xf32>
  bonsai_plan.launch "f" ins(%in : memref<128xf32>) outs(%x : memref<128xf32>)
  bonsai_plan.launch "g" ins(%x : memref<128xf32>) outs(%y : memref<128xf32>)
  bonsai_plan.launch "h" ins(%y : memref<128xf32>) outs(%z : memref<128xf32>)
}
