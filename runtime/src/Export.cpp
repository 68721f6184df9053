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

#include "bonsai/runtime/Executor.h"
#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Nf4.h"
#include "bonsai/runtime/Safetensors.h"

#include <cblas.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
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

/// A number as JSON: integers without a fraction, others with full precision.
std::string jsonNumber(double value) {
  char buf[32];
  if (value == std::floor(value) && std::fabs(value) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", value);
  else
    std::snprintf(buf, sizeof buf, "%.17g", value);
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

ExportSummary exportPeftAdapter(const std::string &dir, const Executor &executor,
                                const std::string &baseModel) {
  const LoadedPlan &plan = executor.plan();
  std::string config = peftAdapterConfig(plan, baseModel);
  checkExportDestination(dir, "adapter directory", /*directory=*/true);
  const std::vector<TensorView> &views = executor.views();
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
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(cols), int(rank),
              float(scale), b.data(), int(rank), a.data(), int(cols), 1.0f, out.data(),
              int(cols));
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

ExportSummary exportMergedWeights(const std::string &path, const Executor &executor) {
  const LoadedPlan &plan = executor.plan();
  checkExportDestination(path, "merged weights file", /*directory=*/false);
  const std::vector<TensorView> &views = executor.views();
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

  std::deque<std::vector<uint8_t>> storage; // converted data, alive until the write
  std::vector<SafetensorsTensor> tensors;
  std::set<std::string> written;
  ExportSummary summary;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    if (t.role != TensorRole::Parameter || t.name.empty() || adapterTensors.count(i) ||
        !written.insert(t.name).second)
      continue;
    const TensorView &view = views[i];
    auto adapter = adapterOfBase.find(i);
    if (adapter != adapterOfBase.end()) {
      const AdapterInfo &a = *adapter->second;
      std::vector<float> merged;
      mergeAdapter(view, views[a.loraA], views[a.loraB],
                   a.magnitude ? &views[*a.magnitude] : nullptr, a.alpha / double(a.rank),
                   merged);
      DType dtype = isComputeFloat(t.dtype) ? t.dtype : views[a.loraA].dtype;
      storage.push_back(fromFloats(merged, dtype, t.shape));
      tensors.push_back({t.name, dtype, t.shape, storage.back().data()});
      ++summary.merged;
    } else if (t.dtype == DType::NF4) {
      auto as = dequantizedAs.find(i);
      DType dtype = as != dequantizedAs.end() ? as->second : DType::BF16;
      storage.push_back(fromFloats(toFloats(view), dtype, t.shape));
      tensors.push_back({t.name, dtype, t.shape, storage.back().data()});
    } else {
      tensors.push_back({t.name, t.dtype, t.shape, view.data});
    }
  }
  if (tensors.empty())
    throw Error("plan '" + plan.path + "' has no named parameter to export");
  writeSafetensors(path, tensors, {{"format", "pt"}});
  summary.tensors = tensors.size();
  return summary;
}

} // namespace bonsai::rt
