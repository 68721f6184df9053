//===- Export.cpp - PEFT adapters and merged weights from a trained plan --===//
//
// The PEFT layout follows peft/utils/save_and_load.py: get_peft_model_state_dict keeps the
// "lora_" entries of the PeftModel's state dict, drops the adapter name ("lora_A.default.weight"
// -> "lora_A.weight") and, for DoRA, the ".weight" of "lora_magnitude_vector.default.weight";
// the PeftModel wraps the transformers model twice (PeftModel.base_model = LoraModel, whose
// .model is the transformers model), hence the "base_model.model." prefix before the module
// path. Merges follow LoraLayer.merge: W + scaling·(B·A), and DoraLinearLayer: the magnitude
// over the row norm of the merged weight, times the merged weight.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Export.h"

#include "bonsai/runtime/Communicator.h"
#include "bonsai/runtime/CpuKernels.h"
#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Nf4.h"
#include "bonsai/runtime/Safetensors.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace bonsai::rt {

namespace {

std::string errnoText() { return std::strerror(errno); }

std::string join(const std::string &dir, const std::string &name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

/// The directory that holds `path` ("." when it has none).
std::string parentOf(std::string path) {
  while (path.size() > 1 && path.back() == '/')
    path.pop_back();
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// fsync of a directory, so that the entries renamed into it are durable.
void syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw Error("cannot open directory '" + dir + "': " + errnoText());
  int rc = ::fsync(fd);
  std::string reason = errnoText();
  ::close(fd);
  if (rc != 0)
    throw Error("cannot flush directory '" + dir + "': " + reason);
}

/// Writes `text` to `path` through a temporary file that is fsynced and renamed into place.
void writeTextAtomically(const std::string &path, const std::string &text) {
  std::string temp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error("cannot create '" + temp + "': " + errnoText());
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      std::string reason = errnoText();
      ::close(fd);
      ::unlink(temp.c_str());
      throw Error("cannot write '" + temp + "': " + reason);
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string reason = errnoText();
    ::unlink(temp.c_str());
    throw Error("cannot flush '" + temp + "': " + reason);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::string reason = errnoText();
    ::unlink(temp.c_str());
    throw Error("cannot rename '" + temp + "' to '" + path + "': " + reason);
  }
}

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string &path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

/// A number as JSON: integers without a fraction, others in the fewest digits that read back
/// as the same double (1e-05, not 1.0000000000000001e-05), as Python's repr writes them.
std::string jsonNumber(double value) {
  char buf[32];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", value);
    return buf;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, value);
    if (std::strtod(buf, nullptr) == value)
      break;
  }
  return buf;
}

/// PEFT's rule for a list of target_modules (check_target_module_exists): a module is adapted
/// when its path equals a target or ends with "." + target.
bool peftMatches(const std::string &target, const std::string &module) {
  return module == target ||
         (module.size() > target.size() &&
          module.compare(module.size() - target.size(), target.size(), target) == 0 &&
          module[module.size() - target.size() - 1] == '.');
}

/// The target_modules PEFT must be given to adapt exactly the plan's adapted modules: the
/// recipe's patterns when they are plain names that select, among the plan's 2-D weights, the
/// adapted modules and no other; otherwise the adapted modules' paths themselves.
std::vector<std::string> peftTargets(const LoadedPlan &plan) {
  std::set<std::string> adapted;
  for (const AdapterInfo &a : plan.adapters)
    adapted.insert(a.module);
  std::vector<std::string> explicitModules(adapted.begin(), adapted.end());
  const std::vector<std::string> &targets = plan.adapterTargets;
  if (targets.empty())
    return explicitModules;
  for (const std::string &t : targets)
    if (t.empty() || t.find_first_of("*?[") != std::string::npos)
      return explicitModules;
  const std::string suffix = ".weight";
  std::set<std::string> selected;
  for (const TensorInfo &t : plan.tensors) {
    if (t.role != TensorRole::Parameter || t.shape.size() != 2 || t.name.size() <= suffix.size() ||
        t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    std::string module = t.name.substr(0, t.name.size() - suffix.size());
    for (const std::string &target : targets)
      if (peftMatches(target, module))
        selected.insert(module);
  }
  return selected == adapted ? targets : explicitModules;
}

/// A copy of `view`'s values as floats (NF4 dequantized).
std::vector<float> toFloats(const TensorView &view) {
  std::vector<float> values(size_t(view.numel()));
  if (view.dtype == DType::NF4)
    dequantizeNf4(static_cast<const uint8_t *>(view.data), uint64_t(view.numel()),
                  view.quantBlock, view.quantDoubleBlock, values.data());
  else if (isComputeFloat(view.dtype))
    loadF32(view, values.data());
  else
    throw Error(std::string("cannot read a ") + dtypeName(view.dtype) + " tensor as floats");
  return values;
}

/// `values` stored as `dtype` (F32, F16 or BF16), as bytes.
std::vector<uint8_t> fromFloats(const std::vector<float> &values, DType dtype,
                                const std::vector<int64_t> &shape) {
  std::vector<uint8_t> bytes(values.size() * dtypeSize(dtype));
  TensorView view;
  view.data = bytes.data();
  view.dtype = dtype;
  view.shape = shape;
  storeF32(values.data(), view);
  return bytes;
}

} // namespace

void checkPeftExportable(const LoadedPlan &plan) {
  if (plan.adapters.empty())
    throw Error("plan '" + plan.path +
                "' has no LoRA or DoRA adapters to export (compile it with a recipe that has "
                "bonsai.lora)");
  const AdapterInfo &first = plan.adapters.front();
  for (const AdapterInfo &a : plan.adapters)
    if (a.rank != first.rank || a.alpha != first.alpha ||
        a.magnitude.has_value() != first.magnitude.has_value())
      throw Error("plan '" + plan.path + "': adapter '" + a.module + "' (rank " +
                  std::to_string(a.rank) + ", alpha " + jsonNumber(a.alpha) +
                  (a.magnitude ? ", DoRA" : ", LoRA") + ") differs from adapter '" +
                  first.module + "' (rank " + std::to_string(first.rank) + ", alpha " +
                  jsonNumber(first.alpha) + (first.magnitude ? ", DoRA" : ", LoRA") +
                  "): one PEFT adapter config holds one rank, alpha and kind");
}

void checkExportDestination(const std::string &path, const std::string &what, bool directory) {
  if (path.empty())
    throw Error(what + " needs a path");
  std::string parent = parentOf(path);
  if (!isDirectory(parent))
    throw Error(what + " '" + path + "': directory '" + parent + "' does not exist");
  if (directory && exists(path) && !isDirectory(path))
    throw Error(what + " '" + path + "': it exists and is not a directory");
  if (!directory && isDirectory(path))
    throw Error(what + " '" + path + "': it is a directory, not a file");
}

std::string peftAdapterConfig(const LoadedPlan &plan, const std::string &baseModel) {
  checkPeftExportable(plan);
  const AdapterInfo &first = plan.adapters.front();
  std::string targets;
  for (const std::string &t : peftTargets(plan))
    targets += (targets.empty() ? "" : ", ") + jsonQuote(t);
  // LoraConfig's fields, sorted as PEFT's save_pretrained writes them; the ones Bonsai has no
  // counterpart of are at their defaults (no dropout, no bias training, no layer selection).
  std::string json = "{\n";
  json += "  \"alpha_pattern\": {},\n";
  json += "  \"base_model_name_or_path\": " + jsonQuote(baseModel) + ",\n";
  json += "  \"bias\": \"none\",\n";
  json += "  \"fan_in_fan_out\": false,\n";
  json += "  \"inference_mode\": true,\n";
  json += "  \"init_lora_weights\": true,\n";
  json += "  \"layers_pattern\": null,\n";
  json += "  \"layers_to_transform\": null,\n";
  json += "  \"lora_alpha\": " + jsonNumber(first.alpha) + ",\n";
  json += "  \"lora_dropout\": 0.0,\n";
  json += "  \"modules_to_save\": null,\n";
  json += "  \"peft_type\": \"LORA\",\n";
  json += "  \"r\": " + std::to_string(first.rank) + ",\n";
  json += "  \"rank_pattern\": {},\n";
  json += "  \"revision\": null,\n";
  json += "  \"target_modules\": [" + targets + "],\n";
  json += "  \"task_type\": \"CAUSAL_LM\",\n";
  json += std::string("  \"use_dora\": ") + (first.magnitude ? "true" : "false") + ",\n";
  json += "  \"use_rslora\": false\n";
  json += "}\n";
  return json;
}

WholeParameters::WholeParameters(const Executor &executor, bool adaptersOnly, int root)
    : plan(executor.plan()), views(executor.views()) {
  std::set<uint32_t> adapterTensors;
  for (const AdapterInfo &a : plan.adapters) {
    adapterTensors.insert(a.loraA);
    adapterTensors.insert(a.loraB);
    if (a.magnitude)
      adapterTensors.insert(*a.magnitude);
  }
  Communicator &comm = executor.communicator();
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    TensorInfo &t = plan.tensors[i];
    if (t.role != TensorRole::Parameter || !t.sharded() ||
        (adaptersOnly && !adapterTensors.count(i)))
      continue;
    // Shards are contiguous flat slices in rank order: the pieces in order are the whole
    // tensor (for the u8 shares of an NF4 weight, its storage). Only the root keeps them.
    const bool keep = comm.rank() == root;
    std::vector<unsigned char> scratch(keep ? 0 : size_t(t.bytes));
    if (keep)
      storage_.emplace_back(size_t(t.wholeBytes()));
    for (int r = 0; r < comm.size(); ++r) {
      unsigned char *piece =
          keep ? storage_.back().data() + size_t(r) * size_t(t.bytes) : scratch.data();
      if (r == comm.rank() && t.bytes)
        std::memcpy(piece, views[i].data, size_t(t.bytes));
      comm.broadcast(piece, size_t(t.numel), t.dtype, r,
                     "export, piece " + std::to_string(r) + " of " + t.name);
    }
    if (!keep)
      continue;
    t.dtype = t.wholeDType();
    t.bytes = t.wholeBytes();
    t.numel = 1;
    for (int64_t d : t.fullShape)
      t.numel *= d;
    t.shape = t.fullShape;
    t.shardRanks = 0;
    t.fullShape.clear();
    views[i].data = storage_.back().data();
    views[i].dtype = t.dtype;
    views[i].shape = t.shape;
  }
}

ExportSummary exportPeftAdapter(const std::string &dir, const Executor &executor,
                                const std::string &baseModel) {
  return exportPeftAdapter(dir, executor.plan(), executor.views(), baseModel);
}

ExportSummary exportPeftAdapter(const std::string &dir, const LoadedPlan &plan,
                                const std::vector<TensorView> &views,
                                const std::string &baseModel) {
  std::string config = peftAdapterConfig(plan, baseModel);
  checkExportDestination(dir, "adapter directory", /*directory=*/true);
  std::vector<SafetensorsTensor> tensors;
  for (const AdapterInfo &a : plan.adapters) {
    std::string prefix = "base_model.model." + a.module;
    tensors.push_back({prefix + ".lora_A.weight", views[a.loraA].dtype, views[a.loraA].shape,
                       views[a.loraA].data});
    tensors.push_back({prefix + ".lora_B.weight", views[a.loraB].dtype, views[a.loraB].shape,
                       views[a.loraB].data});
    if (a.magnitude)
      tensors.push_back({prefix + ".lora_magnitude_vector", views[*a.magnitude].dtype,
                         views[*a.magnitude].shape, views[*a.magnitude].data});
  }

  if (isDirectory(dir)) {
    // An existing directory may hold other files (a README, a tokenizer): replace ours only,
    // the weights first so that the config never describes weights that are not there yet.
    writeSafetensors(join(dir, kPeftWeightsFile), tensors, {{"format", "pt"}});
    writeTextAtomically(join(dir, kPeftConfigFile), config);
    syncDirectory(dir);
    return {tensors.size(), 0};
  }
  std::string parent = parentOf(dir);
  std::string temp = dir;
  while (temp.size() > 1 && temp.back() == '/')
    temp.pop_back();
  temp += ".tmp-" + std::to_string(::getpid());
  if (::mkdir(temp.c_str(), 0755) != 0)
    throw Error("cannot create directory '" + temp + "': " + errnoText());
  try {
    writeSafetensors(join(temp, kPeftWeightsFile), tensors, {{"format", "pt"}});
    writeTextAtomically(join(temp, kPeftConfigFile), config);
    syncDirectory(temp);
    if (std::rename(temp.c_str(), dir.c_str()) != 0)
      throw Error("cannot rename '" + temp + "' to '" + dir + "': " + errnoText());
  } catch (...) {
    ::unlink(join(temp, kPeftWeightsFile).c_str());
    ::unlink(join(temp, kPeftConfigFile).c_str());
    ::rmdir(temp.c_str());
    throw;
  }
  syncDirectory(parent);
  return {tensors.size(), 0};
}

void mergeAdapter(const TensorView &base, const TensorView &loraA, const TensorView &loraB,
                  const TensorView *magnitude, double scale, std::vector<float> &out) {
  int64_t rows = base.dim(0), cols = base.dim(1), rank = loraA.dim(0);
  out = toFloats(base);
  std::vector<float> a = toFloats(loraA), b = toFloats(loraB);
  // out += s · B[rows, rank] · A[rank, cols]
  cpu::gemm("merge_adapter", /*transA=*/false, /*transB=*/false, rows, cols, rank, float(scale),
            b.data(), a.data(), 1.0f, out.data());
  if (!magnitude)
    return;
  std::vector<float> m = toFloats(*magnitude);
  for (int64_t r = 0; r < rows; ++r) {
    float *row = out.data() + r * cols;
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c)
      sum += double(row[c]) * double(row[c]);
    // A zero row stays zero (PEFT divides by the norm and gets NaN; nothing trains to that).
    float factor = sum > 0 ? float(double(m[size_t(r)]) / std::sqrt(sum)) : 0.0f;
    for (int64_t c = 0; c < cols; ++c)
      row[c] *= factor;
  }
}

namespace {

/// One tensor of a merged export: which plan tensor it comes from, and how it is written.
struct MergedTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint32_t tensor = 0;
  const AdapterInfo *adapter = nullptr; ///< Merged with this adapter.
  bool convert = false;                 ///< Through floats (NF4 dequantized, a dtype change).
  uint64_t bytes() const {
    uint64_t n = dtypeSize(dtype);
    for (int64_t d : shape)
      n *= uint64_t(d);
    return n;
  }
};

/// The merged export's tensors, in plan order: every named Parameter that is not an adapter
/// tensor; an adapted one merged in the base's dtype (the adapter's when the base is NF4); an
/// NF4 one in its Dequantize kernel's dtype. With `source`, a float tensor takes the float
/// dtype it has there.
std::vector<MergedTensor> mergedTensors(const LoadedPlan &plan,
                                        const std::vector<TensorView> &views,
                                        const Checkpoint *source, size_t *merged) {
  std::map<uint32_t, const AdapterInfo *> adapterOfBase;
  std::set<uint32_t> adapterTensors;
  for (const AdapterInfo &a : plan.adapters) {
    adapterOfBase[a.base] = &a;
    adapterTensors.insert(a.loraA);
    adapterTensors.insert(a.loraB);
    if (a.magnitude)
      adapterTensors.insert(*a.magnitude);
  }
  // The dtype an NF4 weight is computed in: what its Dequantize kernel produces.
  std::map<uint32_t, DType> dequantizedAs;
  for (const KernelInfo &k : plan.kernels)
    if (k.kind == KernelKind::Dequantize && !k.inputs.empty() && !k.outputs.empty())
      dequantizedAs.emplace(k.inputs[0], plan.tensors[k.outputs[0]].dtype);
  std::vector<MergedTensor> out;
  std::set<std::string> written;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    if (t.role != TensorRole::Parameter || t.name.empty() || adapterTensors.count(i) ||
        !written.insert(t.name).second)
      continue;
    MergedTensor m;
    m.name = t.name;
    m.shape = t.shape;
    m.tensor = i;
    m.dtype = t.dtype;
    auto adapter = adapterOfBase.find(i);
    if (adapter != adapterOfBase.end()) {
      m.adapter = adapter->second;
      m.convert = true;
      m.dtype = isComputeFloat(t.dtype) ? t.dtype : views[m.adapter->loraA].dtype;
      if (merged)
        ++*merged;
    } else if (t.dtype == DType::NF4) {
      auto as = dequantizedAs.find(i);
      m.dtype = as != dequantizedAs.end() ? as->second : DType::BF16;
      m.convert = true;
    }
    if (source && isComputeFloat(m.dtype))
      if (const SafetensorsEntry *e = source->find(t.name))
        if (e->runtimeDType && isComputeFloat(*e->runtimeDType) && *e->runtimeDType != m.dtype) {
          m.dtype = *e->runtimeDType;
          m.convert = true;
        }
    out.push_back(std::move(m));
  }
  if (out.empty())
    throw Error("plan '" + plan.path + "' has no named parameter to export");
  return out;
}

/// `m`'s data: the parameter's bytes as they are, or converted into `storage`.
const void *materialize(const MergedTensor &m, const std::vector<TensorView> &views,
                        std::deque<std::vector<uint8_t>> &storage) {
  const TensorView &view = views[m.tensor];
  if (!m.convert)
    return view.data;
  if (m.adapter) {
    const AdapterInfo &a = *m.adapter;
    std::vector<float> merged;
    mergeAdapter(view, views[a.loraA], views[a.loraB],
                 a.magnitude ? &views[*a.magnitude] : nullptr, a.alpha / double(a.rank), merged);
    storage.push_back(fromFloats(merged, m.dtype, m.shape));
  } else {
    storage.push_back(fromFloats(toFloats(view), m.dtype, m.shape));
  }
  return storage.back().data();
}

/// Copies `from` to `to` (through a temporary file, fsynced and renamed).
void copyFile(const std::string &from, const std::string &to) {
  std::ifstream in(from, std::ios::binary);
  if (!in)
    throw Error("cannot read '" + from + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad())
    throw Error("cannot read '" + from + "'");
  writeTextAtomically(to, text);
}

/// The index of the named 2-D-or-more parameters "<prefix><N>.<rest>": the largest N + 1.
int64_t countLayers(const LoadedPlan &plan, const std::string &prefix) {
  int64_t layers = 0;
  for (const TensorInfo &t : plan.tensors) {
    if (t.role != TensorRole::Parameter || t.name.compare(0, prefix.size(), prefix) != 0)
      continue;
    size_t dot = t.name.find('.', prefix.size());
    std::string digits = t.name.substr(prefix.size(), dot - prefix.size());
    if (!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos)
      layers = std::max<int64_t>(layers, std::stoll(digits) + 1);
  }
  return layers;
}

} // namespace

ExportSummary exportMergedWeights(const std::string &path, const Executor &executor) {
  return exportMergedWeights(path, executor.plan(), executor.views());
}

ExportSummary exportMergedWeights(const std::string &path, const LoadedPlan &plan,
                                  const std::vector<TensorView> &views) {
  checkExportDestination(path, "merged weights file", /*directory=*/false);
  ExportSummary summary;
  std::vector<MergedTensor> planned = mergedTensors(plan, views, nullptr, &summary.merged);
  std::deque<std::vector<uint8_t>> storage; // converted data, alive until the write
  std::vector<SafetensorsTensor> tensors;
  for (const MergedTensor &m : planned)
    tensors.push_back({m.name, m.dtype, m.shape, materialize(m, views, storage)});
  writeSafetensors(path, tensors, {{"format", "pt"}});
  summary.tensors = tensors.size();
  return summary;
}

std::string hfShardName(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index, count);
  return buf;
}

std::string hfConfigFromPlan(const LoadedPlan &plan, DType dtype) {
  std::map<std::string, const TensorInfo *> params;
  for (const TensorInfo &t : plan.tensors)
    if (t.role == TensorRole::Parameter && !t.name.empty())
      params.emplace(t.name, &t);
  auto shapeOf = [&](const std::string &name) -> const std::vector<int64_t> * {
    auto it = params.find(name);
    return it == params.end() ? nullptr : &it->second->shape;
  };
  // The attributes the config needs, from the first kernel that carries each.
  std::optional<double> eps, theta;
  std::optional<int64_t> heads;
  std::optional<bool> tanhGelu;
  for (const KernelInfo &k : plan.kernels) {
    if (const auto *n = std::get_if<NormAttrs>(&k.attrs); n && !eps)
      eps = n->epsilon;
    if (const auto *r = std::get_if<RoPEAttrs>(&k.attrs); r && !theta)
      theta = r->theta;
    if (const auto *g = std::get_if<GeLUAttrs>(&k.attrs); g && !tanhGelu)
      tanhGelu = g->tanh;
    if (std::holds_alternative<AttentionAttrs>(k.attrs) && !heads && !k.inputs.empty() &&
        plan.tensors[k.inputs[0]].shape.size() == 4)
      heads = plan.tensors[k.inputs[0]].shape[2];
  }
  const char *torchDType = dtype == DType::BF16 ? "bfloat16"
                           : dtype == DType::F16 ? "float16"
                                                 : "float32";
  auto fail = [&](const std::string &why) {
    return Error("cannot rebuild a config.json for plan '" + plan.path + "': " + why +
                 " (give --hf-dir, or --weights DIR, the model directory it came from)");
  };
  std::string json = "{\n";
  auto field = [&](const std::string &key, const std::string &value, bool last = false) {
    json += "  " + jsonQuote(key) + ": " + value + (last ? "\n" : ",\n");
  };
  const std::vector<int64_t> *embed = shapeOf("model.embed_tokens.weight");
  if (embed && embed->size() == 2) {
    int64_t layers = countLayers(plan, "model.layers.");
    const std::vector<int64_t> *gate = shapeOf("model.layers.0.mlp.gate_proj.weight");
    const std::vector<int64_t> *k = shapeOf("model.layers.0.self_attn.k_proj.weight");
    const std::vector<int64_t> *q = shapeOf("model.layers.0.self_attn.q_proj.weight");
    if (!layers || !gate || !k || !q || !heads || !eps || !theta)
      throw fail("its Llama-named parameters lack a layer's gate_proj, q_proj or k_proj, or its "
                 "kernels an attention, RMSNorm or RoPE");
    int64_t headDim = (*q)[0] / *heads;
    bool qkvBias = params.count("model.layers.0.self_attn.q_proj.bias") != 0;
    bool qkNorm = params.count("model.layers.0.self_attn.q_norm.weight") != 0;
    std::string arch = qkNorm ? "Qwen3ForCausalLM" : qkvBias ? "Qwen2ForCausalLM"
                                                             : "LlamaForCausalLM";
    std::string type = qkNorm ? "qwen3" : qkvBias ? "qwen2" : "llama";
    const std::vector<int64_t> &ids = plan.tensors[plan.inputs[0]].shape;
    field("architectures", "[" + jsonQuote(arch) + "]");
    field("attention_bias", "false");
    field("attention_dropout", "0.0");
    field("head_dim", std::to_string(headDim));
    field("hidden_act", "\"silu\"");
    field("hidden_size", std::to_string((*embed)[1]));
    field("intermediate_size", std::to_string((*gate)[0]));
    field("max_position_embeddings", std::to_string(ids.size() == 2 ? ids[1] : 2048));
    field("model_type", jsonQuote(type));
    field("num_attention_heads", std::to_string(*heads));
    field("num_hidden_layers", std::to_string(layers));
    field("num_key_value_heads", std::to_string((*k)[0] / headDim));
    field("rms_norm_eps", jsonNumber(*eps));
    field("rope_scaling", "null");
    field("rope_theta", jsonNumber(*theta));
    field("tie_word_embeddings", params.count("lm_head.weight") ? "false" : "true");
    field("torch_dtype", jsonQuote(torchDType));
    field("use_cache", "true");
    field("vocab_size", std::to_string((*embed)[0]), /*last=*/true);
    return json + "}\n";
  }
  std::string prefix = shapeOf("transformer.wte.weight") ? "transformer." : "";
  const std::vector<int64_t> *wte = shapeOf(prefix + "wte.weight");
  const std::vector<int64_t> *wpe = shapeOf(prefix + "wpe.weight");
  if (wte && wpe && wte->size() == 2 && wpe->size() == 2) {
    int64_t layers = countLayers(plan, prefix + "h.");
    const std::vector<int64_t> *fc = shapeOf(prefix + "h.0.mlp.c_fc.weight");
    if (!layers || !fc || fc->size() != 2 || !heads || !eps)
      throw fail("its GPT-2-named parameters lack h.0.mlp.c_fc.weight, or its kernels an "
                 "attention or LayerNorm");
    int64_t hidden = (*wte)[1];
    int64_t inner = (*fc)[0] == hidden ? (*fc)[1] : (*fc)[0];
    field("activation_function", tanhGelu.value_or(true) ? "\"gelu_new\"" : "\"gelu\"");
    field("architectures", "[\"GPT2LMHeadModel\"]");
    field("attn_pdrop", "0.0");
    field("embd_pdrop", "0.0");
    field("layer_norm_epsilon", jsonNumber(*eps));
    field("model_type", "\"gpt2\"");
    field("n_embd", std::to_string(hidden));
    field("n_head", std::to_string(*heads));
    field("n_inner", std::to_string(inner));
    field("n_layer", std::to_string(layers));
    field("n_positions", std::to_string((*wpe)[0]));
    field("resid_pdrop", "0.0");
    field("tie_word_embeddings", params.count("lm_head.weight") ? "false" : "true");
    field("torch_dtype", jsonQuote(torchDType));
    field("vocab_size", std::to_string((*wte)[0]), /*last=*/true);
    return json + "}\n";
  }
  throw fail("its parameters are named neither as a Llama (model.embed_tokens.weight, "
             "model.layers.N...) nor as a GPT-2 (wte.weight, wpe.weight, h.N...)");
}

HfExportSummary exportHfModel(const std::string &dir, const Executor &executor,
                              const HfExportOptions &options) {
  return exportHfModel(dir, executor.plan(), executor.views(), options);
}

HfExportSummary exportHfModel(const std::string &dir, const LoadedPlan &plan,
                              const std::vector<TensorView> &views,
                              const HfExportOptions &options) {
  checkExportDestination(dir, "--export-merged", /*directory=*/true);
  if (options.maxShardBytes == 0)
    throw Error("--shard-size must be positive");
  HfExportSummary summary;
  std::vector<MergedTensor> planned = mergedTensors(plan, views, options.source, &summary.merged);

  // config.json first: a plan whose config cannot be written fails before any weight is.
  std::string config;
  if (!options.sourceDir.empty()) {
    std::string path = join(options.sourceDir, "config.json");
    if (!exists(path))
      throw Error("--export-merged: model directory '" + options.sourceDir +
                  "' has no config.json");
    summary.configCopied = true;
  } else {
    DType embedType = planned.front().dtype;
    for (const MergedTensor &m : planned)
      if (m.name == "model.embed_tokens.weight" || m.name == "wte.weight" ||
          m.name == "transformer.wte.weight")
        embedType = m.dtype;
    config = hfConfigFromPlan(plan, embedType);
  }

  // Hugging Face's rule (huggingface_hub.split_torch_state_dict_into_shards): tensors in order,
  // a new shard when the next one would take the current one past the limit.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t shardBytes = 0;
  for (size_t i = 0; i < planned.size(); ++i) {
    uint64_t bytes = planned[i].bytes();
    if (!shards.back().empty() && shardBytes + bytes > options.maxShardBytes) {
      shards.emplace_back();
      shardBytes = 0;
    }
    shards.back().push_back(i);
    shardBytes += bytes;
    summary.totalBytes += bytes;
  }

  bool fresh = !isDirectory(dir);
  std::string target = dir;
  while (target.size() > 1 && target.back() == '/')
    target.pop_back();
  std::string out = fresh ? target + ".tmp-" + std::to_string(::getpid()) : target;
  if (fresh && ::mkdir(out.c_str(), 0755) != 0)
    throw Error("cannot create directory '" + out + "': " + errnoText());
  std::vector<std::string> made;
  try {
    std::map<std::string, std::string> weightMap;
    for (size_t s = 0; s < shards.size(); ++s) {
      std::string name = hfShardName(s + 1, shards.size());
      std::deque<std::vector<uint8_t>> storage; // one shard's converted data at a time
      std::vector<SafetensorsTensor> tensors;
      for (size_t i : shards[s]) {
        const MergedTensor &m = planned[i];
        tensors.push_back({m.name, m.dtype, m.shape, materialize(m, views, storage)});
        weightMap[m.name] = name;
      }
      writeSafetensors(join(out, name), tensors, {{"format", "pt"}});
      made.push_back(name);
      summary.tensors += tensors.size();
    }
    std::string index = "{\n  \"metadata\": {\n    \"total_size\": " +
                        std::to_string(summary.totalBytes) + "\n  },\n  \"weight_map\": {";
    size_t n = 0;
    for (const auto &[name, file] : weightMap)
      index += std::string(n++ ? "," : "") + "\n    " + jsonQuote(name) + ": " + jsonQuote(file);
    index += "\n  }\n}\n";
    writeTextAtomically(join(out, "model.safetensors.index.json"), index);
    made.push_back("model.safetensors.index.json");
    if (summary.configCopied)
      copyFile(join(options.sourceDir, "config.json"), join(out, "config.json"));
    else
      writeTextAtomically(join(out, "config.json"), config);
    made.push_back("config.json");
    if (!options.sourceDir.empty())
      for (const char *file : kHfTokenizerFiles)
        if (exists(join(options.sourceDir, file))) {
          copyFile(join(options.sourceDir, file), join(out, file));
          made.push_back(file);
          ++summary.tokenizerFiles;
        }
    syncDirectory(out);
    if (fresh && std::rename(out.c_str(), target.c_str()) != 0)
      throw Error("cannot rename '" + out + "' to '" + target + "': " + errnoText());
  } catch (...) {
    if (fresh) {
      for (const std::string &file : made)
        ::unlink(join(out, file).c_str());
      ::rmdir(out.c_str());
    }
    throw;
  }
  syncDirectory(parentOf(target));
  summary.shards = shards.size();
  return summary;
}

} // namespace bonsai::rt
