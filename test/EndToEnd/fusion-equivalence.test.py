"""Driver of fusion-equivalence.test: compiles each model and recipe unfused and fused (by
default, and with one family at a time), runs every plan from the same seed, and prints one line
per configuration saying whether the dumped gradients and the step lines are byte for byte those
of the unfused plan. Any difference is named on that line (and fails the FileCheck)."""
import filecmp
import os
import subprocess
import sys

compile_tool, run_tool, models, out = sys.argv[1:5]

# Every family, and those whose kernels compute what the unfused ones do in another order
# (flash-attention: exp(x - lse) instead of an online softmax; elementwise on LoRA's swiglu:
# f32 instead of f64 inside) and are compared with a tolerance by their own tests
# (flash-attention-equivalence.test, fusion-elementwise-lora.test).
FAMILIES = ["linear-cross-entropy", "flash-attention", "residual-norm", "slice-gradients",
            "gemm-epilogue", "optimizer", "elementwise"]
NOT_BITWISE = {"flash-attention"}


def without(*families):
    """Compile flags leaving out `families` besides those that are not bitwise."""
    left_out = sorted(NOT_BITWISE | set(families))
    return ["--fuse-disable=" + ",".join(left_out)]


def only(family):
    return without(*[f for f in FAMILIES if f != family])


# Which plans each recipe compares with the unfused one: (label, extra compile flags). "default"
# is every bitwise family.
VARIANTS = {
    "adamw": [("default", without())] + [(f + " only", only(f)) for f in FAMILIES
                                         if f not in NOT_BITWISE],
    "full": [("default", without())],
    "mb2": [("default", without())],
    "ib": [("default", without())],
    "lora": [("default", without("elementwise"))],
    "galore": [("default", without())],
}
# Recipes whose targets name the model's own linears: (model, recipe) -> the recipe file's
# stem in the test's directory; absent pairs are skipped (GPT-2's Conv1D weights, stored
# [in, out], take no LoRA adapters: docs/lora.md).
PER_MODEL = {("tiny_llama", "lora"): "lora", ("tiny_llama", "galore"): "galore.llama",
             ("tiny_gpt2", "galore"): "galore.gpt2"}
# Gradients are dumped per micro-batch and not kept with update_in_backward: those compare
# the trained steps only.
STEPS_ONLY = {"mb2", "ib", "galore"}


def run(args):
    result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(args), result.stdout, result.stderr))
    return result.stdout


def build(model, recipe, name, flags):
    plan = os.path.join(out, "%s.%s.%s.plan" % (model, recipe, name))
    stem = PER_MODEL.get((model, recipe), recipe)
    run([compile_tool, os.path.join(models, model + ".mlir"),
         os.path.join(out, stem + ".mlir"), "-o", plan] + flags)
    return plan


def results(plan, recipe):
    """The gradient dump (None when not comparable) and the step lines of a plan."""
    micro = ["--micro-batches", "2"] if recipe == "mb2" else []
    grads = None
    if recipe not in STEPS_ONLY:
        grads = plan + ".grads.safetensors"
        run([run_tool, plan, "--seed", "1", "--dump-gradients", grads])
    steps = [line for line in run([run_tool, plan, "--seed", "1", "--steps", "3"] + micro)
             .splitlines() if line.startswith("step")]
    return grads, steps


first_steps = None
for model in ("tiny_llama", "tiny_gpt2"):
    for recipe, variants in VARIANTS.items():
        if recipe in ("lora", "galore") and (model, recipe) not in PER_MODEL:
            continue
        base_grads, base_steps = results(build(model, recipe, "unfused", ["--fuse=false"]),
                                         recipe)
        if first_steps is None:
            first_steps = base_steps
        for label, flags in variants:
            grads, steps = results(build(model, recipe, label.replace(" ", "_"), flags), recipe)
            words = []
            if grads is not None:
                same = filecmp.cmp(grads, base_grads, shallow=False)
                words.append("gradients identical" if same else "gradients DIFFER")
            words.append("steps identical" if steps == base_steps else
                         "steps DIFFER: %s vs %s" % (steps, base_steps))
            print("%s %s %s: %s" % (model, recipe, label, ", ".join(words)))
print(first_steps[0])
