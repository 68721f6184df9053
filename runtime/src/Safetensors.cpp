//===- Safetensors.cpp - Reading, writing and binding safetensors weights -===//
//
// Headers are read and validated whole before any tensor data is touched; data is then read
// tensor by tensor with positioned reads, so a multi-gigabyte checkpoint is never held in
// memory twice. Binding collects every mismatch before reporting, because a user loading the
// wrong checkpoint wants the whole picture, not the first name.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Safetensors.h"

#include "bonsai/runtime/Nf4.h"

#include "bonsai/runtime/Json.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace bonsai::rt {

namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kMaxIndexBytes = 100'000'000;

struct DTypeSpelling {
  const char *name;
  size_t size;
  std::optional<DType> runtime;
};

// Every dtype of the safetensors format; those the runtime has map to it.
const DTypeSpelling kDTypes[] = {
    {"BOOL", 1, std::nullopt},       {"U8", 1, DType::U8},
    {"I8", 1, std::nullopt},         {"F8_E5M2", 1, DType::F8E5M2},
    {"F8_E4M3", 1, DType::F8E4M3FN}, {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},        {"F16", 2, DType::F16},
    {"BF16", 2, DType::BF16},        {"I32", 4, DType::I32},
    {"U32", 4, std::nullopt},        {"F32", 4, DType::F32},
    {"F64", 8, std::nullopt},        {"I64", 8, DType::I64},
    {"U64", 8, std::nullopt},
};

const DTypeSpelling *findDType(const std::string &name) {
  for (const DTypeSpelling &d : kDTypes)
    if (name == d.name)
      return &d;
  return nullptr;
}

bool isFloatStorage(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

uint64_t readLE64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

std::string directoryOf(const std::string &path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

bool endsWith(const std::string &s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The size of an open stream's file, or -1.
std::streamoff streamSize(std::ifstream &in) {
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0);
  return size;
}

std::string shapeOf(const std::vector<int64_t> &shape) { return formatShape(shape); }

} // namespace

bool isNf4Storage(const SafetensorsEntry &entry, uint64_t bytes) {
  return entry.dtype == "U8" && entry.shape == std::vector<int64_t>{int64_t(bytes)};
}

const char *safetensorsDTypeName(DType dtype) {
  // NF4 tensors are written as their storage bytes (shape [bytes]), as are the shares of them.
  if (dtype == DType::NF4 || dtype == DType::U8)
    return "U8";
  for (const DTypeSpelling &d : kDTypes)
    if (d.runtime == dtype)
      return d.name;
  return "?";
}

std::vector<SafetensorsEntry> readSafetensorsHeader(const std::string &path,
                                                    std::map<std::string, std::string> *metadata) {
  auto fail = [&](const std::string &message) -> Error {
    return Error("safetensors file '" + path + "': " + message);
  };
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error("cannot open safetensors file '" + path + "'");
  std::streamoff fileSize = streamSize(in);
  if (fileSize < 0)
    throw fail("cannot determine its size (not a regular file?)");
  if (fileSize < 8)
    throw fail("is " + std::to_string(fileSize) +
               " bytes long, too short for the 8-byte header length (truncated?)");
  unsigned char lengthBytes[8];
  if (!in.read(reinterpret_cast<char *>(lengthBytes), 8))
    throw fail("cannot read the header length");
  uint64_t headerBytes = readLE64(lengthBytes);
  uint64_t available = uint64_t(fileSize) - 8;
  if (headerBytes > available)
    throw fail("header length " + std::to_string(headerBytes) + " exceeds the " +
               std::to_string(available) + " bytes after it (truncated or not safetensors)");
  if (headerBytes > kMaxHeaderBytes)
    throw fail("header length " + std::to_string(headerBytes) + " is above the limit of " +
               std::to_string(kMaxHeaderBytes) + " bytes");
  if (headerBytes < 2)
    throw fail("header length " + std::to_string(headerBytes) + " is too small for a JSON object");
  std::string header(size_t(headerBytes), '\0');
  if (!in.read(header.data(), std::streamsize(headerBytes)))
    throw fail("cannot read the " + std::to_string(headerBytes) + "-byte header");
  uint64_t dataStart = 8 + headerBytes;
  uint64_t dataSize = uint64_t(fileSize) - dataStart;

  JsonValue root = parseJson(header, "safetensors file '" + path + "' header");
  if (!root.isObject())
    throw fail("header is a JSON " + std::string(root.kindName()) + ", expected an object");

  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < root.keys().size(); ++i) {
    const std::string &name = root.keys()[i];
    const JsonValue &v = root.values()[i];
    if (name == "__metadata__") {
      if (!v.isObject())
        throw fail("__metadata__ is a " + std::string(v.kindName()) + ", expected an object");
      for (size_t m = 0; m < v.keys().size(); ++m) {
        if (!v.values()[m].isString())
          throw fail("__metadata__ value of \"" + v.keys()[m] + "\" is a " +
                     v.values()[m].kindName() + ", expected a string");
        if (metadata)
          (*metadata)[v.keys()[m]] = v.values()[m].stringValue();
      }
      continue;
    }
    std::string what = "tensor '" + name + "'";
    if (name.empty())
      throw fail("a tensor has an empty name");
    if (!v.isObject())
      throw fail(what + " is a " + v.kindName() + ", expected an object");
    for (const std::string &key : v.keys())
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        throw fail(what + " has an unknown field \"" + key + "\"");
    const JsonValue *dtype = v.find("dtype");
    const JsonValue *shape = v.find("shape");
    const JsonValue *offsets = v.find("data_offsets");
    if (!dtype || !shape || !offsets)
      throw fail(what + " lacks " +
                 std::string(!dtype ? "\"dtype\"" : !shape ? "\"shape\"" : "\"data_offsets\""));
    if (!dtype->isString())
      throw fail(what + " dtype is a " + dtype->kindName() + ", expected a string");
    const DTypeSpelling *spelling = findDType(dtype->stringValue());
    if (!spelling)
      throw fail(what + " has an unknown dtype \"" + dtype->stringValue() + "\"");

    SafetensorsEntry e;
    e.name = name;
    e.dtype = spelling->name;
    e.elementSize = spelling->size;
    e.runtimeDType = spelling->runtime;
    e.file = path;
    if (!shape->isArray())
      throw fail(what + " shape is a " + shape->kindName() + ", expected an array");
    // Dimensions may be 0 (empty tensors are legal). Otherwise the product is bounded by the
    // data section's size, which keeps it from overflowing.
    for (const JsonValue &d : shape->elements()) {
      int64_t dim;
      if (!d.getInt64(dim) || dim < 0)
        throw fail(what + " shape has an entry that is not a non-negative integer");
      e.shape.push_back(dim);
    }
    uint64_t numel = 1;
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
      numel = 0;
    } else {
      for (int64_t dim : e.shape) {
        if (numel > dataSize / uint64_t(dim))
          throw fail(what + " shape " + shapeOf(e.shape) + " needs more bytes than the file has");
        numel *= uint64_t(dim);
      }
    }
    e.numel = numel;
    if (!offsets->isArray() || offsets->elements().size() != 2 ||
        !offsets->elements()[0].isUnsigned() || !offsets->elements()[1].isUnsigned())
      throw fail(what + " data_offsets must be [begin, end] with non-negative integers");
    uint64_t begin = offsets->elements()[0].unsignedValue();
    uint64_t end = offsets->elements()[1].unsignedValue();
    if (begin > end || end > dataSize)
      throw fail(what + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 "] are outside the " + std::to_string(dataSize) + "-byte data section");
    if (numel > dataSize / e.elementSize)
      throw fail(what + " shape " + shapeOf(e.shape) + " needs more bytes than the file has");
    e.bytes = numel * e.elementSize;
    if (end - begin != e.bytes)
      throw fail(what + " has " + std::to_string(end - begin) + " bytes of data, but " +
                 shapeOf(e.shape) + " " + e.dtype + " needs " + std::to_string(e.bytes));
    e.offset = dataStart + begin;
    entries.push_back(std::move(e));
  }

  // No two tensors may share bytes: a writer bug that would silently alias weights.
  std::vector<const SafetensorsEntry *> byOffset;
  for (const SafetensorsEntry &e : entries)
    if (e.bytes > 0)
      byOffset.push_back(&e);
  std::sort(byOffset.begin(), byOffset.end(),
            [](const SafetensorsEntry *a, const SafetensorsEntry *b) { return a->offset < b->offset; });
  for (size_t i = 1; i < byOffset.size(); ++i)
    if (byOffset[i]->offset < byOffset[i - 1]->offset + byOffset[i - 1]->bytes)
      throw fail("tensors '" + byOffset[i - 1]->name + "' and '" + byOffset[i]->name +
                 "' overlap in the data section");
  return entries;
}

const SafetensorsEntry *Checkpoint::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const SafetensorsEntry &e, std::string_view n) { return e.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

Checkpoint Checkpoint::open(const std::string &path) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  if (!endsWith(path, ".json")) {
    ckpt.tensors_ = readSafetensorsHeader(path, &ckpt.metadata_);
  } else {
    auto fail = [&](const std::string &message) -> Error {
      return Error("checkpoint index '" + path + "': " + message);
    };
    std::ifstream in(path, std::ios::binary);
    if (!in)
      throw Error("cannot open checkpoint index '" + path + "'");
    std::streamoff size = streamSize(in);
    if (size < 0 || uint64_t(size) > kMaxIndexBytes)
      throw fail("is not a regular file or is larger than " + std::to_string(kMaxIndexBytes) + " bytes");
    std::string text(size_t(size), '\0');
    if (size > 0 && !in.read(text.data(), size))
      throw fail("cannot read it");
    JsonValue root = parseJson(text, "checkpoint index '" + path + "'");
    if (!root.isObject())
      throw fail("is a JSON " + std::string(root.kindName()) + ", expected an object");
    const JsonValue *map = root.find("weight_map");
    if (!map || !map->isObject())
      throw fail("has no \"weight_map\" object");
    if (const JsonValue *meta = root.find("metadata"); meta && meta->isObject())
      for (size_t i = 0; i < meta->keys().size(); ++i) {
        const JsonValue &m = meta->values()[i];
        if (m.isString())
          ckpt.metadata_[meta->keys()[i]] = m.stringValue();
        else if (m.isUnsigned())
          ckpt.metadata_[meta->keys()[i]] = std::to_string(m.unsignedValue());
      }
    // Each shard's header is read once; the index is authoritative, so tensors a shard holds
    // but the index does not list are not part of the checkpoint.
    std::map<std::string, std::vector<SafetensorsEntry>> shards;
    std::string dir = directoryOf(path);
    for (size_t i = 0; i < map->keys().size(); ++i) {
      const std::string &name = map->keys()[i];
      const JsonValue &file = map->values()[i];
      if (!file.isString() || file.stringValue().empty())
        throw fail("weight_map entry '" + name + "' is not a file name");
      const std::string &shardName = file.stringValue();
      if (shardName[0] == '/')
        throw fail("weight_map entry '" + name + "' names an absolute path '" + shardName +
                   "' (shards are relative to the index)");
      std::string shardPath = dir + shardName;
      auto it = shards.find(shardPath);
      if (it == shards.end())
        it = shards.emplace(shardPath, readSafetensorsHeader(shardPath, nullptr)).first;
      auto entry = std::find_if(it->second.begin(), it->second.end(),
                                [&](const SafetensorsEntry &e) { return e.name == name; });
      if (entry == it->second.end())
        throw fail("weight_map puts '" + name + "' in '" + shardName +
                   "', which has no tensor of that name");
      ckpt.tensors_.push_back(*entry);
    }
  }
  std::sort(ckpt.tensors_.begin(), ckpt.tensors_.end(),
            [](const SafetensorsEntry &a, const SafetensorsEntry &b) { return a.name < b.name; });
  for (size_t i = 1; i < ckpt.tensors_.size(); ++i)
    if (ckpt.tensors_[i].name == ckpt.tensors_[i - 1].name)
      throw Error("checkpoint '" + path + "' has tensor '" + ckpt.tensors_[i].name + "' twice");
  return ckpt;
}

void Checkpoint::read(const SafetensorsEntry &entry, const TensorView &dst) const {
  std::string what = "tensor '" + entry.name + "' of '" + entry.file + "'";
  if (dst.dtype == DType::NF4) {
    if (isNf4Storage(entry, dst.bytes())) {
      // A checkpoint of the quantized weight: its bytes, as they were.
      std::ifstream in(entry.file, std::ios::binary);
      in.seekg(std::streamoff(entry.offset));
      if (!in || !in.read(static_cast<char *>(dst.data), std::streamsize(entry.bytes)))
        throw Error(what + ": cannot read " + std::to_string(entry.bytes) + " bytes at offset " +
                    std::to_string(entry.offset) + " (was the file truncated?)");
      return;
    }
    // Full-precision weights are quantized as they are bound (docs/quantization.md).
    if (dst.shape != entry.shape)
      throw Error(what + ": shape " + formatShape(entry.shape) +
                  " does not match the destination " + formatShape(dst.shape));
    if (!entry.runtimeDType || !isFloatStorage(*entry.runtimeDType))
      throw Error(what + ": an nf4 weight is quantized from F32, F16 or BF16, not " +
                  entry.dtype);
    std::vector<float> values(size_t(entry.numel));
    TensorView staging = dst;
    staging.data = values.data();
    staging.dtype = DType::F32;
    read(entry, staging);
    quantizeNf4(values.data(), uint64_t(values.size()), dst.quantBlock, dst.quantDoubleBlock,
                static_cast<uint8_t *>(dst.data));
    return;
  }
  if (dst.shape != entry.shape)
    throw Error(what + ": shape " + formatShape(entry.shape) + " does not match the destination " +
                formatShape(dst.shape));
  if (!entry.runtimeDType)
    throw Error(what + ": dtype " + entry.dtype + " is not supported by the runtime");
  // The whole tensor is the slice of all its elements.
  readSlice(entry, 0, dst);
}

void Checkpoint::readSlice(const SafetensorsEntry &entry, int64_t first,
                           const TensorView &dst) const {
  std::string what = "tensor '" + entry.name + "' of '" + entry.file + "'";
  const uint64_t n = uint64_t(dst.numel());
  if (first < 0 || uint64_t(first) > entry.numel || n > entry.numel - uint64_t(first))
    throw Error(what + ": elements [" + std::to_string(first) + ", " +
                std::to_string(first + int64_t(n)) + ") are outside its " +
                std::to_string(entry.numel));
  if (!entry.runtimeDType || dst.dtype == DType::NF4)
    throw Error(what + ": dtype " + entry.dtype + " cannot be read as a " + dtypeName(dst.dtype) +
                " shard");
  DType src = *entry.runtimeDType;
  bool same = src == dst.dtype;
  if (!same && !(isFloatStorage(src) && isFloatStorage(dst.dtype)))
    throw Error(what + ": cannot convert " + entry.dtype + " to " + dtypeName(dst.dtype));
  const uint64_t offset = entry.offset + uint64_t(first) * entry.elementSize;
  const uint64_t bytes = n * entry.elementSize;
  std::ifstream in(entry.file, std::ios::binary);
  if (!in)
    throw Error(what + ": cannot open the file");
  std::vector<char> staging;
  char *target = static_cast<char *>(dst.data);
  if (!same) {
    staging.resize(size_t(bytes));
    target = staging.data();
  }
  in.seekg(std::streamoff(offset));
  if (bytes > 0 && !in.read(target, std::streamsize(bytes)))
    throw Error(what + ": cannot read " + std::to_string(bytes) + " bytes at offset " +
                std::to_string(offset) + " (was the file truncated?)");
  if (!same) {
    TensorView srcView;
    srcView.data = staging.data();
    srcView.dtype = src;
    srcView.shape = {int64_t(n)};
    std::vector<float> values(static_cast<size_t>(n));
    loadF32(srcView, values.data());
    storeF32(values.data(), dst);
  }
}

void writeSafetensors(const std::string &path, const std::vector<SafetensorsTensor> &tensors,
                      const std::map<std::string, std::string> &metadata) {
  std::set<std::string> names;
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto &[key, value] : metadata) {
      header += (first ? "" : ",") + jsonQuote(key) + ":" + jsonQuote(value);
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const SafetensorsTensor &t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second)
      throw Error("writing '" + path + "': tensor name '" + t.name + "' is empty, reserved or repeated");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        throw Error("writing '" + path + "': tensor '" + t.name + "' has a negative dimension");
      numel *= uint64_t(d);
    }
    uint64_t bytes = numel * dtypeSize(t.dtype);
    std::string shape;
    for (int64_t d : t.shape)
      shape += (shape.empty() ? "" : ",") + std::to_string(d);
    if (header.size() > 1)
      header += ",";
    header += jsonQuote(t.name) + ":{\"dtype\":\"" + safetensorsDTypeName(t.dtype) +
              "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
    sizes.push_back(bytes);
  }
  header += "}";
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  while (header.size() % 8 != 0)
    header += ' ';

  std::string temp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error("cannot create '" + temp + "': " + std::strerror(errno));
  auto writeAll = [&](const void *data, uint64_t size) {
    const char *p = static_cast<const char *>(data);
    while (size > 0) {
      ssize_t n = ::write(fd, p, size_t(std::min<uint64_t>(size, 1u << 30)));
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        std::string reason = std::strerror(errno);
        ::close(fd);
        ::unlink(temp.c_str());
        throw Error("cannot write '" + temp + "': " + reason);
      }
      p += n;
      size -= uint64_t(n);
    }
  };
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
  writeAll(length, 8);
  writeAll(header.data(), header.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    writeAll(tensors[i].data, sizes[i]);
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw Error("cannot flush '" + temp + "': " + reason);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::string reason = std::strerror(errno);
    ::unlink(temp.c_str());
    throw Error("cannot rename '" + temp + "' to '" + path + "': " + reason);
  }
}

std::string formatNameList(const char *label, const std::vector<std::string> &names) {
  if (names.empty())
    return "";
  std::string s = "; " + std::to_string(names.size()) + " " + label + ": ";
  for (size_t i = 0; i < names.size(); ++i)
    s += (i ? ", " : "") + names[i];
  return s;
}

const char *ignoredHfTensorReason(std::string_view name) {
  auto endsWith = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // Llama-family checkpoints of transformers < 4.31 saved the RoPE frequencies as a buffer.
  if (endsWith("rotary_emb.inv_freq"))
    return "RoPE frequencies (recomputed from rope_theta)";
  // GPT-2's causal mask and its fill value, buffers of GPT2Attention ("h.0.attn.bias"; the
  // projections' biases are "attn.c_attn.bias" and "attn.c_proj.bias").
  if (name == "attn.bias" || endsWith(".attn.bias") || name == "attn.masked_bias" ||
      endsWith(".attn.masked_bias"))
    return "attention-mask buffer";
  // Saved by some tied models; the model reads the embedding instead.
  if (name == "lm_head.weight")
    return "LM head tied to the embedding";
  return nullptr;
}

std::string resolveWeightsPath(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return path;
  std::string dir = path.empty() || path.back() == '/' ? path : path + "/";
  for (const char *name : {"model.safetensors.index.json", "model.safetensors"})
    if (::stat((dir + name).c_str(), &st) == 0)
      return dir + name;
  throw Error("weights directory '" + path +
              "' has neither model.safetensors nor model.safetensors.index.json");
}

std::vector<bool> bindCheckpoint(const LoadedPlan &plan, const Checkpoint &checkpoint,
                                 const std::vector<TensorView> &views,
                                 std::vector<std::string> *ignored, int rank) {
  if (views.size() != plan.tensors.size())
    throw Error("internal error: binding needs one view per plan tensor");
  std::vector<std::string> missing, misShaped;
  std::set<std::string> planNames;
  std::vector<std::pair<uint32_t, const SafetensorsEntry *>> bindings;
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorInfo &t = plan.tensors[i];
    if (t.role != TensorRole::Parameter)
      continue;
    planNames.insert(t.name);
    const SafetensorsEntry *e = checkpoint.find(t.name);
    if (!e) {
      // An adapter the file does not hold starts from its initializer (docs/lora.md).
      if (t.init == TensorInit::None)
        missing.push_back(t.name);
      continue;
    }
    bool convertible = e->runtimeDType &&
                       (*e->runtimeDType == t.dtype ||
                        (isFloatStorage(*e->runtimeDType) && isFloatStorage(t.dtype)));
    // An NF4 parameter (or a rank's share of one) binds full-precision weights (quantized as
    // they are read) or the storage bytes a checkpoint saved.
    if (t.wholeDType() == DType::NF4) {
      if (isNf4Storage(*e, t.wholeBytes())) {
        bindings.emplace_back(i, e);
        continue;
      }
      convertible = e->runtimeDType && isFloatStorage(*e->runtimeDType);
    }
    // A shard binds the whole tensor's name and shape (docs/sharding.md).
    const std::vector<int64_t> &whole = t.sharded() ? t.fullShape : t.shape;
    if (e->shape != whole || !convertible) {
      misShaped.push_back(t.name + " (plan " +
                          (t.sharded() ? "shard of " + std::to_string(t.shardRanks) + " of " : "") +
                          formatShape(whole) + " " + dtypeName(t.wholeDType()) + ", checkpoint " +
                          formatShape(e->shape) + " " + e->dtype + ")");
      continue;
    }
    bindings.emplace_back(i, e);
  }
  std::vector<std::string> extra;
  for (const SafetensorsEntry &e : checkpoint.tensors()) {
    if (planNames.count(e.name))
      continue;
    if (ignoredHfTensorReason(e.name)) {
      if (ignored)
        ignored->push_back(e.name);
    } else {
      extra.push_back(e.name);
    }
  }

  if (!missing.empty() || !extra.empty() || !misShaped.empty()) {
    std::string message = "weights '" + checkpoint.path() + "' do not match plan '" + plan.path +
                          "'" + formatNameList("missing", missing) +
                          formatNameList("extra", extra) + formatNameList("mis-shaped", misShaped);
    throw Error(message);
  }
  std::vector<bool> bound(plan.tensors.size(), false);
  for (const auto &[index, entry] : bindings) {
    const TensorInfo &t = plan.tensors[index];
    if (t.nf4Share()) {
      // The whole weight quantized (or its saved storage), then this rank's bytes of it.
      std::vector<uint8_t> storage;
      TensorView whole = wholeNf4View(t, storage);
      checkpoint.read(*entry, whole);
      copyNf4Share(t, whole, rank, views[index]);
    } else if (t.sharded())
      checkpoint.readSlice(*entry, t.shardOffset(rank), views[index]);
    else
      checkpoint.read(*entry, views[index]);
    bound[index] = true;
  }
  return bound;
}

} // namespace bonsai::rt
