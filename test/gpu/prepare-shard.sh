#!/usr/bin/env bash
# test/gpu/prepare-shard.sh - pack, on the build machine, what test/gpu/shard-one-rank.sh runs on
# a GPU machine (docs/sharding.md, "On the H200"): the sm_90a bonsai-run and
# bonsai-runtime-tests, their libraries, and plans compiled for the H200: the tiny Llama (f32)
# and a 2-layer Llama-124M (bf16), each unsharded and with bonsai.shard zero1, zero2 and zero3
# over one rank (zero3 also with reshard_after_forward false and "auto", and with
# --gathers-ahead=3), the tiny Llama's QLoRA unsharded
# and zero3 over one rank (its NF4 weights in u8 shares), and a tiny zero3 plan for two ranks
# (refused when run alone). Also ring attention's CUDA tests and timings on one GPU
# (test/gpu/ring-one-gpu.sh as ring.sh, with ring_attention_bench).
#
#   bash test/gpu/prepare-shard.sh        # -> .gpu-shard/ and .gpu-shard.tar.xz
#   # on the GPU machine: tar -xJf .gpu-shard.tar.xz && bash .gpu-shard/run.sh
#   #                     && bash .gpu-shard/ring.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${BONSAI_BUILD_DIR:-build}"
ninja -C "$build" bonsai-compile
if [ ! -f build-sm90a/build.ninja ]; then
  cmake -G Ninja -S runtime -B build-sm90a -DCMAKE_BUILD_TYPE=Release \
    -DBONSAI_CUDA_ARCHS=90a-real > /dev/null
fi
ninja -C build-sm90a bonsai-run bonsai-runtime-tests ring_attention_bench
D=.gpu-shard
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib" "$D/plans"
for tool in bonsai-run bonsai-runtime-tests ring_attention_bench; do
  strip -o "$D/bin/$tool" "build-sm90a/bin/$tool"
done
. bench/gpu_libs.sh
copy_gpu_libs "$D/lib"
cp test/gpu/shard-one-rank.sh "$D/run.sh"
cp test/gpu/ring-one-gpu.sh "$D/ring.sh"
cp bench/ring_attention_bench.py "$D/"
C="$build/bin/bonsai-compile"
python3 scripts/gen_models.py --print llama_124m --set=layers=2 --set=seq=512 --set=batch=2 \
  > "$D/plans/llama_124m_2l.mlir"
# zero3auto: reshard_after_forward "auto" (bonsai-compile compiles both ways and chooses);
# zero3ahead3: each all-gather issued three gathers ahead (--gathers-ahead=3). The zero3 plans
# for --target=h200 take the prefetch distance the compiler weighs.
for z in none zero1 zero2 zero3 zero3kept zero3auto zero3ahead3; do
  shard="" flags=""
  case $z in
    none) ;;
    zero3kept) shard="  bonsai.shard \"zero3\" ranks 1 reshard_after_forward false\n" ;;
    zero3auto) shard="  bonsai.shard \"zero3\" ranks 1 reshard_after_forward \"auto\"\n" ;;
    zero3ahead3) shard="  bonsai.shard \"zero3\" ranks 1\n" flags="--gathers-ahead=3" ;;
    *) shard="  bonsai.shard \"$z\" ranks 1\n" ;;
  esac
  printf "bonsai.recipe @r {\n${shard}  bonsai.optimizer \"adamw\" lr 1.000000e-03 {grad_clip = 1.000000e+00 : f64, weight_decay = 1.000000e-02 : f64}\n}\n" \
    > "$D/plans/r_$z.mlir"
  "$C" examples/models/tiny_llama.mlir "$D/plans/r_$z.mlir" --target=h200 $flags \
    -o "$D/plans/tiny_llama_$z.plan" > "$D/plans/tiny_llama_$z.txt" 2>&1
  "$C" "$D/plans/llama_124m_2l.mlir" "$D/plans/r_$z.mlir" --target=h200 $flags \
    -o "$D/plans/llama_124m_2l_$z.plan" > "$D/plans/llama_124m_2l_$z.txt" 2>&1
done
# The same zero3 plan with every launch in order on the compute stream: what the collectives
# stream and the prefetch change.
"$C" "$D/plans/llama_124m_2l.mlir" "$D/plans/r_zero3.mlir" --target=h200 --overlap-copies=false \
  -o "$D/plans/llama_124m_2l_zero3_inorder.plan" > "$D/plans/llama_124m_2l_zero3_inorder.txt" 2>&1
# QLoRA: the NF4 base weights shared out by their storage bytes (u8 shares gathered by NCCL).
q='  bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj", "v_proj", "down_proj"]\n  bonsai.lora rank 8 alpha 1.600000e+01 targets ["q_proj", "v_proj", "down_proj"]\n  bonsai.optimizer "adamw" lr 1.000000e-02 {grad_clip = 1.000000e+00 : f64}\n'
printf "bonsai.recipe @r {\n${q}}\n" > "$D/plans/rq_none.mlir"
printf "bonsai.recipe @r {\n  bonsai.shard \"zero3\" ranks 1\n${q}}\n" > "$D/plans/rq_zero3.mlir"
for z in none zero3; do
  "$C" examples/models/tiny_llama.mlir "$D/plans/rq_$z.mlir" --target=h200 \
    -o "$D/plans/tiny_llama_qlora_$z.plan" > "$D/plans/tiny_llama_qlora_$z.txt" 2>&1
done
# FP8 (delayed scaling): the step's cast statistics folded over micro-batches, and all-reduced to
# their largest (a copy on one rank) before the scale updates of the sharded plans.
f='  bonsai.fp8 "delayed" amax_history 4 margin 0 targets []\n  bonsai.optimizer "adamw" lr 1.000000e-03 {grad_clip = 1.000000e+00 : f64}\n'
for z in none zero1 zero3; do
  shard=""
  [ "$z" = none ] || shard="  bonsai.shard \"$z\" ranks 1\n"
  printf "bonsai.recipe @r {\n${shard}${f}}\n" > "$D/plans/rf_$z.mlir"
  for m in tiny_llama llama_124m_2l; do
    src=examples/models/$m.mlir; [ $m = llama_124m_2l ] && src="$D/plans/llama_124m_2l.mlir"
    "$C" "$src" "$D/plans/rf_$z.mlir" --target=h200 \
      -o "$D/plans/${m}_fp8_$z.plan" > "$D/plans/${m}_fp8_$z.txt" 2>&1
  done
done
printf 'bonsai.recipe @r {\n  bonsai.shard "zero3" ranks 2\n  bonsai.optimizer "adamw" lr 1.000000e-03\n}\n' \
  > "$D/plans/r2.mlir"
"$C" examples/models/tiny_llama.mlir "$D/plans/r2.mlir" --target=h200 \
  -o "$D/plans/tiny_llama_zero3r2.plan" > /dev/null 2>&1
tar -cJf "$D.tar.xz" "$D"
echo "prepare-shard: $D.tar.xz ($(du -h "$D.tar.xz" | cut -f1))"
