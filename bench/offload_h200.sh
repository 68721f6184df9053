#!/usr/bin/env bash
# bench/offload_h200.sh DIR BONSAI_RUN [PARTS] - on the GPU machine, the plans of
# bench/prepare_offload_run.sh through bench/offload_bench.py, with BONSAI_RUN a CUDA build's
# bonsai-run (test/gpu/prepare.sh's bin-sm90a/bonsai-run). PARTS picks models:
# small (Llama 124M and TinyLlama-1.1B, the default), 7b (Llama-2-7B, 16k tokens per step:
# about three minutes) and act (activation offload: Llama-2-7B at 32k tokens against its
# on-device step, Llama-3-8B QLoRA at 16k and 32k against the recompute-only plan: about four
# minutes), and tile (the MLPs in chunks of the sequence: Llama-3-8B QLoRA at 32k against the
# untiled plan, and at 128k on the device (83 GiB) against 24 GiB with the activations
# offloaded: about nine minutes). Logs under $OUT when it is set.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:?usage: bench/offload_h200.sh DIR BONSAI_RUN [small,7b,act,tile]}"
run="${2:?usage: bench/offload_h200.sh DIR BONSAI_RUN [small,7b,act,tile]}"
parts="${3:-small}"
[ -d "$dir" ] || tar -xJf "$dir.tar.xz"
out="${OUT:-/tmp/offload_h200}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
bench() { # MODEL VARIANTS STEPS WARMUP
  echo "== $1: $2 =="
  python3 bench/offload_bench.py --model "$1" --plans "$dir/plans" --bonsai-run "$run" \
    --variants "$2" --steps "$3" --warmup "$4" --workdir "$out" 2>&1 | tee "$out/offload_$1.log"
}
small=gpu,offload-inorder,offload,inbwd-gpu,inbwd-offload,inbwd-host,inbwd-auto
case ",$parts," in *,small,*)
  bench llama_124m "$small" 20 5
  bench tinyllama_1_1b "$small" 8 2 ;;
esac
case ",$parts," in *,7b,*)
  bench llama2_7b gpu,inbwd-gpu,inbwd-offload,inbwd-host,inbwd-auto 4 2 ;;
esac
case ",$parts," in *,act,*)
  bench llama2_7b_b16 gpu,inbwd-auto-act 4 2
  bench llama3_8b_qlora_s16384 full,full-act,auto-act 4 2
  bench llama3_8b_qlora_s32768 full,full-act,auto-act 4 2 ;;
esac
case ",$parts," in *,tile,*)
  bench llama3_8b_qlora_s32768 full-act,full-act-tiled 3 2
  bench llama3_8b_qlora_s131072 full-tiled,full-act-tiled 1 1 ;;
esac
