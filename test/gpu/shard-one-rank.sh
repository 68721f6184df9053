#!/usr/bin/env bash
# test/gpu/shard-one-rank.sh (packed by test/gpu/prepare-shard.sh as .gpu-shard/run.sh), on the
# GPU machine: sharded plans (bonsai.shard ... ranks 1) through the CUDA backend's
# collective kinds (NCCL on one rank) against the unsharded plan, and the runtime's tests.
set -uo pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp}
B=bin/bonsai-run
nvidia-smi -L
echo "== runtime tests (collective kinds, NCCL, kernel table)"
timeout 300 bin/bonsai-runtime-tests --gtest_filter='*Collective*:Nccl*:KernelTable*:*Shard*:RingContract*' 2>&1 | tail -15
for m in tiny_llama llama_124m_2l; do
  steps=30; [ $m = llama_124m_2l ] && steps=20
  timeout 300 $B plans/${m}_none.plan --seed 3 --steps $steps --metrics $out/${m}_none.jsonl > $out/${m}_none.log 2>&1; echo "$m none rc=$?"
  for z in zero1 zero2 zero3 zero3kept zero3auto zero3ahead3; do
    timeout 300 $B plans/${m}_$z.plan --seed 3 --steps $steps --metrics $out/${m}_$z.jsonl > $out/${m}_$z.log 2>&1; echo "$m $z rc=$?"
    python3 - "$out/${m}_none.jsonl" "$out/${m}_$z.jsonl" "$m $z" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)) if b else float("nan")
same = all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(a, b))
print("%s: %d/%d steps, last loss %s vs %s, max rel diff %.3g, %s, tok/s %s vs %s" % (sys.argv[3], len(b), len(a), b[-1]["loss"] if b else None, a[-1]["loss"], worst, "identical" if same else "differ", b[-1]["tokens_per_s"] if b else None, a[-1]["tokens_per_s"]))
PY
  done
done
echo "== FP8 sharded over one rank: the statistics all-reduced (max) before the scale updates"
for m in tiny_llama llama_124m_2l; do
  for z in none zero1 zero3; do
    timeout 300 $B plans/${m}_fp8_$z.plan --seed 3 --steps 20 --micro-batches 2 \
      --metrics $out/${m}_fp8_$z.jsonl > $out/${m}_fp8_$z.log 2>&1; echo "$m fp8 $z rc=$?"
  done
  python3 - "$out" "$m" <<'PY'
import json, sys
out, m = sys.argv[1:3]
a = [json.loads(l) for l in open("%s/%s_fp8_none.jsonl" % (out, m))]
for z in ["zero1", "zero3"]:
    b = [json.loads(l) for l in open("%s/%s_fp8_%s.jsonl" % (out, m, z))]
    same = len(a) == len(b) == 20 and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"]
                                          for x, y in zip(a, b))
    print("%s fp8 %s vs none (2 micro-batches): %d/%d steps, last loss %s vs %s, %s" % (
        m, z, len(b), len(a), b[-1]["loss"] if b else None, a[-1]["loss"] if a else None,
        "identical" if same else "differ"))
PY
done
echo "== the collectives stream against every launch in order (llama_124m_2l zero3, 3 runs each)"
for v in zero3 zero3_inorder zero3 zero3_inorder zero3 zero3_inorder; do
  timeout 300 $B plans/llama_124m_2l_$v.plan --seed 3 --steps 30 --metrics $out/ov_$v.jsonl \
    > $out/ov_$v.log 2>&1 || echo "$v rc=$?"
  grep "^time: 30 steps" $out/ov_$v.log | sed "s/^/$v: /"
done
echo "== under mpirun -np 1 (Open MPI's launcher, the MPI host communicator)"
if command -v mpirun > /dev/null; then
  timeout 120 mpirun --allow-run-as-root -np 1 $B plans/tiny_llama_zero3.plan --seed 3 --steps 30 --metrics $out/mpi_zero3.jsonl > $out/mpi.log 2>&1; echo "mpirun rc=$?"; tail -3 $out/mpi.log
  python3 -c "
import json;a=[json.loads(l) for l in open('$out/tiny_llama_none.jsonl')];b=[json.loads(l) for l in open('$out/mpi_zero3.jsonl')]
print('mpirun zero3 vs none identical:', all(x['loss']==y['loss'] for x,y in zip(a,b)) and len(a)==len(b))"
else echo "no mpirun"; fi
echo "== checkpoints and exports of a plan sharded over one rank (CUDA)"
ck=$out/ck-zero3; rm -rf $ck $out/exp-*; mkdir -p $out/exp-zero3 $out/exp-none
timeout 300 $B plans/tiny_llama_zero3.plan --seed 3 --steps 20 --save-every 10 --ckpt-dir $ck \
  --metrics $out/ck_full.jsonl > $out/ck_full.log 2>&1; echo "save rc=$?"
for p in zero3 none; do
  timeout 300 $B plans/tiny_llama_$p.plan --resume $ck/step-00000010 --steps 10 \
    --export-merged $out/exp-$p/merged.safetensors --metrics $out/ck_$p.jsonl > $out/ck_$p.log 2>&1
  echo "resume on $p rc=$?"
done
python3 - "$out" <<'PY'
import filecmp, json, sys
out = sys.argv[1]
full = [json.loads(l)["loss"] for l in open(out + "/ck_full.jsonl")][10:]
for p in ["zero3", "none"]:
    got = [json.loads(l)["loss"] for l in open(out + "/ck_%s.jsonl" % p)]
    print("resumed on %s: %d steps, %s" % (p, len(got), "the uninterrupted losses" if got == full
                                           else "losses differ"))
same = filecmp.cmp(out + "/exp-zero3/merged.safetensors", out + "/exp-none/merged.safetensors",
                   shallow=False)
print("export of the sharded plan: %s" % ("the unsharded plan's bytes" if same else "differs"))
PY
echo "== QLoRA, its NF4 weights in u8 shares gathered by NCCL (CUDA)"
rm -rf $out/q-*; mkdir -p $out/q-none $out/q-zero3
for p in none zero3; do
  timeout 300 $B plans/tiny_llama_qlora_$p.plan --seed 3 --steps 30 --metrics $out/q_$p.jsonl \
    --export-merged $out/q-$p/merged.safetensors --export-adapter $out/q-$p/adapter \
    > $out/q_$p.log 2>&1; echo "qlora $p rc=$?"
done
python3 - "$out" <<'PY'
import filecmp, json, sys
out = sys.argv[1]
a = [json.loads(l) for l in open(out + "/q_none.jsonl")]
b = [json.loads(l) for l in open(out + "/q_zero3.jsonl")]
same = len(a) == len(b) == 30 and all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"]
                                      for x, y in zip(a, b))
print("qlora zero3 vs none: %d/%d steps, last loss %s vs %s, %s" % (
    len(b), len(a), b[-1]["loss"] if b else None, a[-1]["loss"] if a else None,
    "identical" if same else "differ"))
for f in ["merged.safetensors", "adapter/adapter_model.safetensors"]:
    same = filecmp.cmp(out + "/q-zero3/" + f, out + "/q-none/" + f, shallow=False)
    print("qlora export %s: %s" % (f, "the unsharded plan's bytes" if same else "differs"))
PY
echo "== a 2-rank plan run alone"
timeout 60 $B plans/tiny_llama_zero3r2.plan --steps 1 2>&1 | tail -1
tail -4 $out/llama_124m_2l_zero3.log
