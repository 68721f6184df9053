//===- HfImport.cpp - Hugging Face config.json and checkpoint -> bonsai IR -===//
//
// Typed, checked access to config.json (every key the graph depends on is validated, with an
// error naming it), the Llama-family and GPT-2 graphs built op by op as scripts/gen_models.py
// writes them, and the check of a checkpoint's tensors against the graph's parameters.
//
//===----------------------------------------------------------------------===//

#include "bonsai/Import/HfImport.h"

#include "bonsai/runtime/Json.h"
#include "bonsai/runtime/Safetensors.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <limits>
#include <set>

namespace mlir::bonsai::hf {

namespace rt = ::bonsai::rt;

namespace {

/// The largest size (of a dimension, a layer count, a position count) a config may give. Real
/// models stay far below it (vocabularies of 256k, contexts of millions); a larger value is a
/// corrupt config, and below it the products the graph takes (heads * head_dim, 4 * hidden)
/// cannot overflow.
constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();

/// Typed access to config.json: every required key that is missing or of the wrong kind is an
/// error naming the key and the file.
class Config {
public:
  Config(rt::JsonValue root, std::string path) : root(std::move(root)), path(std::move(path)) {}

  /// The member `key`, or nullptr when it is absent or null (HF writes unset options as null).
  const rt::JsonValue *find(llvm::StringRef key) const {
    const rt::JsonValue *value = root.find(std::string_view(key.data(), key.size()));
    return value && !value->isNull() ? value : nullptr;
  }

  int64_t positive(llvm::StringRef key) const {
    const rt::JsonValue *value = find(key);
    if (!value)
      throw ImportError(missing(key));
    return positive(key, *value);
  }
  std::optional<int64_t> optionalPositive(llvm::StringRef key) const {
    const rt::JsonValue *value = find(key);
    return value ? std::optional<int64_t>(positive(key, *value)) : std::nullopt;
  }

  double number(llvm::StringRef key) const {
    const rt::JsonValue *value = find(key);
    if (!value)
      throw ImportError(missing(key));
    if (!value->isNumber() || !std::isfinite(value->numberValue()) || value->numberValue() <= 0)
      throw ImportError(where(key) + " must be a positive number");
    return value->numberValue();
  }

  std::string string(llvm::StringRef key) const {
    const rt::JsonValue *value = find(key);
    if (!value)
      throw ImportError(missing(key));
    if (!value->isString())
      throw ImportError(where(key) + " must be a string, not " + value->kindName());
    return value->stringValue();
  }
  std::optional<std::string> optionalString(llvm::StringRef key) const {
    return find(key) ? std::optional<std::string>(string(key)) : std::nullopt;
  }

  bool flag(llvm::StringRef key, bool defaultValue) const {
    const rt::JsonValue *value = find(key);
    if (!value)
      return defaultValue;
    if (!value->isBool())
      throw ImportError(where(key) + " must be true or false, not " + value->kindName());
    return value->boolValue();
  }

  /// "config.json: 'key'", for messages.
  std::string where(llvm::StringRef key) const { return path + ": '" + key.str() + "'"; }

private:
  std::string missing(llvm::StringRef key) const {
    return path + " has no '" + key.str() + "' (a required key of this architecture)";
  }
  int64_t positive(llvm::StringRef key, const rt::JsonValue &value) const {
    int64_t result;
    if (!value.getInt64(result) || result <= 0)
      throw ImportError(where(key) + " must be a positive integer");
    if (result > kMaxSize)
      throw ImportError(where(key) + " is " + std::to_string(result) + ", above the largest size " +
                        std::to_string(kMaxSize) + " the importer takes (a corrupt config?)");
    return result;
  }

  rt::JsonValue root;
  std::string path;
};

/// Rejects an option of the config that changes the model in a way the graph does not express.
void refuseIf(bool condition, const Config &config, llvm::StringRef key, llvm::StringRef what) {
  if (condition)
    throw ImportError(config.where(key) + ": " + what.str() + " is not supported");
}

/// Reads a rope_scaling object (transformers 4.x's top-level "rope_scaling", or 5's
/// "rope_parameters", which also holds rope_theta): type "default" is none, "llama3" is
/// Llama 3.1's scaling; every other type is refused, naming it.
std::optional<ModelConfig::Llama3Scaling> readRopeScaling(const rt::JsonValue &rope,
                                                          const std::string &where) {
  if (!rope.isObject())
    throw ImportError(where + " must be an object");
  const rt::JsonValue *type = rope.find("rope_type");
  if (!type)
    type = rope.find("type"); // transformers before 4.45
  std::string name = !type ? "default" : type->isString() ? type->stringValue() : "(not a string)";
  if (name == "default")
    return std::nullopt;
  if (name != "llama3")
    throw ImportError(where + ": rope type '" + name +
                      "' is not supported (only 'default' and 'llama3' RoPE)");
  auto number = [&](const char *key) {
    const rt::JsonValue *v = rope.find(key);
    if (!v || !v->isNumber() || !(v->numberValue() > 0))
      throw ImportError(where + ": llama3 rope scaling needs a positive '" + std::string(key) +
                        "'");
    return v->numberValue();
  };
  // Read in this order, which is the order of the errors for missing ones.
  double factor = number("factor"), low = number("low_freq_factor"),
         high = number("high_freq_factor"), original = number("original_max_position_embeddings");
  // A position count: whole, and small enough to convert to an integer.
  if (original != std::floor(original) || original > double(kMaxSize))
    throw ImportError(where +
                      ": llama3 rope scaling's 'original_max_position_embeddings' must "
                      "be a whole number of positions up to " +
                      std::to_string(kMaxSize));
  ModelConfig::Llama3Scaling s{factor, low, high, int64_t(original)};
  if (!(s.highFreqFactor > s.lowFreqFactor))
    throw ImportError(where + ": llama3 rope scaling needs high_freq_factor above "
                              "low_freq_factor");
  return s;
}

ModelConfig readLlamaFamily(const Config &config, const std::string &architecture) {
  ModelConfig c;
  c.architecture = architecture;
  c.family = Family::Llama;
  c.vocab = config.positive("vocab_size");
  c.hidden = config.positive("hidden_size");
  c.layers = config.positive("num_hidden_layers");
  c.heads = config.positive("num_attention_heads");
  // HF's default: as many key/value heads as query heads (multi-head attention).
  c.kvHeads = config.optionalPositive("num_key_value_heads").value_or(c.heads);
  c.intermediate = config.positive("intermediate_size");
  c.positions = config.positive("max_position_embeddings");
  c.eps = config.number("rms_norm_eps");
  c.tied = config.flag("tie_word_embeddings", false);
  c.qkvBias = architecture == "Qwen2ForCausalLM";
  if (architecture == "Qwen3ForCausalLM") {
    c.qkNorm = true;
    c.qkvBias = config.flag("attention_bias", false);
  }

  std::string act = config.string("hidden_act");
  if (act != "silu")
    throw ImportError(config.where("hidden_act") + ": activation '" + act +
                      "' is not supported (the gated MLP computes silu(gate) * up)");
  // Transformers 5 moves the RoPE settings into "rope_parameters"; 4.x writes rope_theta and
  // rope_scaling at the top level.
  if (const rt::JsonValue *scaling = config.find("rope_scaling"))
    c.ropeScaling = readRopeScaling(*scaling, config.where("rope_scaling"));
  if (const rt::JsonValue *rope = config.find("rope_parameters")) {
    c.ropeScaling = readRopeScaling(*rope, config.where("rope_parameters"));
    const rt::JsonValue *theta = rope->find("rope_theta");
    if (!theta || !theta->isNumber() || theta->numberValue() <= 0)
      throw ImportError(config.where("rope_parameters") + " has no positive 'rope_theta'");
    c.ropeTheta = theta->numberValue();
  } else if (config.find("rope_theta")) {
    c.ropeTheta = config.number("rope_theta");
  } else {
    // Configs written before transformers 4.31 have no rope_theta; transformers reads them
    // with 10000.
    c.ropeTheta = 10000.0;
    printNote(config.where("rope_theta") + " is absent: using transformers' default 10000");
  }
  if (architecture == "LlamaForCausalLM") {
    refuseIf(config.flag("attention_bias", false), config, "attention_bias",
             "a Llama with attention biases");
  }
  refuseIf(config.flag("mlp_bias", false), config, "mlp_bias", "an MLP with biases");

  if (c.heads % c.kvHeads != 0)
    throw ImportError(config.where("num_key_value_heads") + " " + std::to_string(c.kvHeads) +
                      " does not divide num_attention_heads " + std::to_string(c.heads));
  // head_dim may differ from hidden_size / num_attention_heads (Qwen3-0.6B: 1024 / 16 with
  // head_dim 128): the projections are then [heads * head_dim, hidden] and back.
  if (std::optional<int64_t> explicitHeadDim = config.optionalPositive("head_dim")) {
    c.headDim = *explicitHeadDim;
  } else {
    if (c.hidden % c.heads != 0)
      throw ImportError(config.where("hidden_size") + " " + std::to_string(c.hidden) +
                        " is not a multiple of num_attention_heads " + std::to_string(c.heads) +
                        " and the config gives no head_dim");
    c.headDim = c.hidden / c.heads;
  }
  if (c.headDim % 2 != 0)
    throw ImportError(config.where(config.find("head_dim") ? "head_dim" : "hidden_size") +
                      ": head dimension " + std::to_string(c.headDim) +
                      " is odd, and RoPE rotates pairs");

  // Mistral always slides; Qwen2 and Qwen3 only with use_sliding_window.
  bool slides = architecture == "MistralForCausalLM" ||
                ((architecture == "Qwen2ForCausalLM" || architecture == "Qwen3ForCausalLM") &&
                 config.flag("use_sliding_window", false));
  if (slides)
    c.slidingWindow = config.optionalPositive("sliding_window");
  return c;
}

ModelConfig readGPT2(const Config &config) {
  ModelConfig c;
  c.architecture = "GPT2LMHeadModel";
  c.family = Family::GPT2;
  c.vocab = config.positive("vocab_size");
  c.hidden = config.positive("n_embd");
  c.layers = config.positive("n_layer");
  c.heads = config.positive("n_head");
  c.kvHeads = c.heads;
  c.positions = config.positive("n_positions");
  c.intermediate = config.optionalPositive("n_inner").value_or(4 * c.hidden);
  c.eps = config.number("layer_norm_epsilon");
  c.tied = config.flag("tie_word_embeddings", true);
  std::string act = config.string("activation_function");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast")
    c.gelu = GeluApproximation::Tanh;
  else if (act == "gelu")
    c.gelu = GeluApproximation::None;
  else
    throw ImportError(config.where("activation_function") + ": activation '" + act +
                      "' is not supported (gelu_new, gelu_pytorch_tanh or gelu)");
  refuseIf(!config.flag("scale_attn_weights", true), config, "scale_attn_weights",
           "attention without the 1/sqrt(head_dim) scale");
  refuseIf(config.flag("scale_attn_by_inverse_layer_idx", false), config,
           "scale_attn_by_inverse_layer_idx", "scaling attention by the layer index");
  refuseIf(config.flag("add_cross_attention", false), config, "add_cross_attention",
           "cross-attention");
  if (c.hidden % c.heads != 0)
    throw ImportError(config.where("n_embd") + " " + std::to_string(c.hidden) +
                      " is not a multiple of n_head " + std::to_string(c.heads));
  return c;
}

/// Builds `func.func @forward` op by op as scripts/gen_models.py writes it: each value carries
/// the generator's name as a NameLoc, printed as the SSA name.
class ModelBuilder {
public:
  ModelBuilder(ModuleOp module, Type dtype) : b(module.getBodyRegion()), dtype(dtype) {}

  RankedTensorType type(llvm::ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, dtype);
  }
  Location loc(llvm::StringRef name) { return NameLoc::get(b.getStringAttr(name)); }

  Value param(llvm::StringRef name, const std::string &hfName, llvm::ArrayRef<int64_t> shape) {
    expected.push_back({hfName, std::vector<int64_t>(shape.begin(), shape.end())});
    return ParamOp::create(b, loc(name), type(shape), hfName, /*trainable=*/true, nullptr, nullptr)
        .getResult();
  }

  template <typename OpTy, typename... Args>
  Value op(llvm::StringRef name, llvm::ArrayRef<int64_t> shape, Args &&...args) {
    return OpTy::create(b, loc(name), type(shape), std::forward<Args>(args)...).getResult();
  }

  OpBuilder b;
  Type dtype;
  std::vector<ExpectedTensor> expected;
};

llvm::APFloat f64(double value) { return llvm::APFloat(value); }

/// The Llama family (Llama, Mistral, Qwen2, Qwen3): pre-norm blocks of grouped-query attention
/// with RoPE and a SwiGLU MLP; Qwen2 adds biases to the q, k and v projections, Qwen3 an
/// RMSNorm over each query and key head (weights [head_dim]) before RoPE.
Value buildLlama(ModelBuilder &e, const ModelConfig &c, int64_t B, int64_t S, Value ids,
                 Value labels, Value positions, Value segmentIds) {
  int64_t D = c.hidden, V = c.vocab, H = c.heads, KV = c.kvHeads, I = c.intermediate;
  int64_t hd = c.headDim;
  llvm::SmallVector<int64_t> x_t{B, S, D};
  Value emb = e.param("embed", "model.embed_tokens.weight", {V, D});
  Value x = e.op<EmbeddingOp>("h", x_t, emb, ids);
  llvm::APFloat scale = f64(1.0 / std::sqrt(double(hd)));
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    std::string n = "l" + std::to_string(i) + "_";
    auto linear = [&](llvm::StringRef name, Value input, llvm::StringRef hf, int64_t out,
                      int64_t in, bool bias) {
      Value w = e.param(n + name.str() + "_w", p + hf.str() + ".weight", {out, in});
      Value bv = bias ? e.param(n + name.str() + "_b", p + hf.str() + ".bias", {out}) : Value();
      return e.op<LinearOp>(n + name.str(), {B, S, out}, input, w, bv);
    };
    Value w = e.param(n + "ln1_w", p + "input_layernorm.weight", {D});
    Value h = e.op<RMSNormOp>(n + "ln1", x_t, x, w, f64(c.eps));
    Value q = linear("q", h, "self_attn.q_proj", H * hd, D, c.qkvBias);
    Value k = linear("k", h, "self_attn.k_proj", KV * hd, D, c.qkvBias);
    Value v = linear("v", h, "self_attn.v_proj", KV * hd, D, c.qkvBias);
    llvm::SmallVector<int64_t> q4_t{B, S, H, hd}, kv4_t{B, S, KV, hd};
    q = e.op<ReshapeOp>(n + "q4", q4_t, q);
    k = e.op<ReshapeOp>(n + "k4", kv4_t, k);
    v = e.op<ReshapeOp>(n + "v4", kv4_t, v);
    if (c.qkNorm) {
      Value qw = e.param(n + "qn_w", p + "self_attn.q_norm.weight", {hd});
      q = e.op<RMSNormOp>(n + "qn", q4_t, q, qw, f64(c.eps));
      Value kw = e.param(n + "kn_w", p + "self_attn.k_norm.weight", {hd});
      k = e.op<RMSNormOp>(n + "kn", kv4_t, k, kw, f64(c.eps));
    }
    if (c.ropeScaling || positions) {
      // Llama 3.1's scaled frequencies and packed rows' positions (both optional).
      Builder &b = e.b;
      FloatAttr theta = b.getF64FloatAttr(c.ropeTheta), factor, low, high;
      IntegerAttr original;
      if (c.ropeScaling) {
        factor = b.getF64FloatAttr(c.ropeScaling->factor);
        low = b.getF64FloatAttr(c.ropeScaling->lowFreqFactor);
        high = b.getF64FloatAttr(c.ropeScaling->highFreqFactor);
        original = b.getI64IntegerAttr(c.ropeScaling->originalMaxPositions);
      }
      q = e.op<RoPEOp>(n + "qr", q4_t, q, positions, theta, factor, low, high, original);
      k = e.op<RoPEOp>(n + "kr", kv4_t, k, positions, theta, factor, low, high, original);
    } else {
      q = e.op<RoPEOp>(n + "qr", q4_t, q, f64(c.ropeTheta));
      k = e.op<RoPEOp>(n + "kr", kv4_t, k, f64(c.ropeTheta));
    }
    Value a = segmentIds ? e.op<AttentionOp>(n + "attn", q4_t, q, k, v, segmentIds,
                                             /*causal=*/true, scale, /*ring_ranks=*/nullptr)
                         : e.op<AttentionOp>(n + "attn", q4_t, q, k, v, /*causal=*/true, scale);
    a = e.op<ReshapeOp>(n + "attn2", {B, S, H * hd}, a);
    Value o = linear("o", a, "self_attn.o_proj", D, H * hd, false);
    x = e.op<AddOp>(n + "res1", x_t, x, o);
    w = e.param(n + "ln2_w", p + "post_attention_layernorm.weight", {D});
    h = e.op<RMSNormOp>(n + "ln2", x_t, x, w, f64(c.eps));
    Value g = linear("gate", h, "mlp.gate_proj", I, D, false);
    Value u = linear("up", h, "mlp.up_proj", I, D, false);
    Value m = e.op<SwiGLUOp>(n + "act", {B, S, I}, g, u);
    Value d = linear("down", m, "mlp.down_proj", D, I, false);
    x = e.op<AddOp>(n + "res2", x_t, x, d);
  }
  Value w = e.param("norm_w", "model.norm.weight", {D});
  Value h = e.op<RMSNormOp>("norm", x_t, x, w, f64(c.eps));
  Value head = c.tied ? emb : e.param("lm_head", "lm_head.weight", {V, D});
  Value logits = e.op<LinearOp>("logits", {B, S, V}, h, head, Value());
  return CrossEntropyOp::create(e.b, e.loc("loss"), RankedTensorType::get({}, e.b.getF32Type()),
                                logits, labels)
      .getResult();
}

/// GPT-2: learned positions, pre-norm blocks with LayerNorm, a fused q/k/v Conv1D and a GELU
/// MLP. Conv1D stores its weight [in, out]: each is transposed to linear's [out, in].
/// `prefix` is "transformer." or "" (the original GPT-2 checkpoints have no prefix).
Value buildGPT2(ModelBuilder &e, const ModelConfig &c, int64_t B, int64_t S, Value ids,
                Value labels, const std::string &prefix) {
  int64_t D = c.hidden, V = c.vocab, H = c.heads, P = c.positions, I = c.intermediate;
  int64_t hd = D / H;
  llvm::SmallVector<int64_t> x_t{B, S, D}, h4_t{B, S, H, hd};
  Value wte = e.param("wte", prefix + "wte.weight", {V, D});
  Value wpe = e.param("wpe", prefix + "wpe.weight", {P, D});
  Value tok = e.op<EmbeddingOp>("tok", x_t, wte, ids);
  Value pos = e.op<SliceOp>("pos", {S, D}, wpe, /*axis=*/0, /*start=*/0);
  Value x = e.op<AddOp>("h", x_t, tok, pos);
  llvm::APFloat scale = f64(1.0 / std::sqrt(double(hd)));
  for (int64_t i = 0; i < c.layers; ++i) {
    std::string p = prefix + "h." + std::to_string(i) + ".";
    std::string n = "l" + std::to_string(i) + "_";
    auto layerNorm = [&](llvm::StringRef name, Value input, llvm::StringRef hf) {
      Value w = e.param(n + name.str() + "_w", p + hf.str() + ".weight", {D});
      Value b = e.param(n + name.str() + "_b", p + hf.str() + ".bias", {D});
      return e.op<LayerNormOp>(n + name.str(), x_t, input, w, b, f64(c.eps));
    };
    auto conv1d = [&](llvm::StringRef name, Value input, llvm::StringRef hf, int64_t in,
                      int64_t out) {
      Value w = e.param(n + name.str() + "_w", p + hf.str() + ".weight", {in, out});
      Value b = e.param(n + name.str() + "_b", p + hf.str() + ".bias", {out});
      Value wt =
          e.op<TransposeOp>(n + name.str() + "_wt", {out, in}, w, llvm::ArrayRef<int64_t>{1, 0});
      return e.op<LinearOp>(n + name.str(), {B, S, out}, input, wt, b);
    };
    Value h = layerNorm("ln1", x, "ln_1");
    Value qkv = conv1d("qkv", h, "attn.c_attn", D, 3 * D);
    llvm::SmallVector<Value, 3> heads;
    for (int j = 0; j < 3; ++j) {
      std::string part(1, "qkv"[j]);
      Value t = e.op<SliceOp>(n + part, x_t, qkv, /*axis=*/2, /*start=*/uint64_t(j * D));
      heads.push_back(e.op<ReshapeOp>(n + part + "4", h4_t, t));
    }
    Value a = e.op<AttentionOp>(n + "attn", h4_t, heads[0], heads[1], heads[2],
                                /*causal=*/true, scale);
    a = e.op<ReshapeOp>(n + "attn2", x_t, a);
    Value o = conv1d("proj", a, "attn.c_proj", D, D);
    x = e.op<AddOp>(n + "res1", x_t, x, o);
    h = layerNorm("ln2", x, "ln_2");
    Value f = conv1d("fc", h, "mlp.c_fc", D, I);
    Value g = e.op<GeLUOp>(n + "gelu", {B, S, I}, f, c.gelu);
    Value m = conv1d("mlp", g, "mlp.c_proj", I, D);
    x = e.op<AddOp>(n + "res2", x_t, x, m);
  }
  Value w = e.param("lnf_w", prefix + "ln_f.weight", {D});
  Value b = e.param("lnf_b", prefix + "ln_f.bias", {D});
  Value h = e.op<LayerNormOp>("lnf", x_t, x, w, b, f64(c.eps));
  // GPT-2 ties the output projection to the token embedding (unless the config says not).
  Value head = c.tied ? wte : e.param("lm_head", "lm_head.weight", {V, D});
  Value logits = e.op<LinearOp>("logits", {B, S, V}, h, head, Value());
  return CrossEntropyOp::create(e.b, e.loc("loss"), RankedTensorType::get({}, e.b.getF32Type()),
                                logits, labels)
      .getResult();
}

/// "a, b, c and 4 more".
std::string listNames(const std::vector<std::string> &names, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > limit)
    out += " and " + std::to_string(names.size() - limit) + " more";
  return out;
}

} // namespace

void printNote(const std::string &message) {
  llvm::errs() << "bonsai-import-hf: note: " << message << "\n";
}

ModelConfig parseModelConfig(std::string_view text, const std::string &path) {
  Config config(rt::parseJson(text, path), path);
  const rt::JsonValue *archs = config.find("architectures");
  if (!archs)
    throw ImportError(path + " has no 'architectures'");
  if (!archs->isArray() || archs->elements().size() != 1 || !archs->elements()[0].isString())
    throw ImportError(config.where("architectures") + " must list exactly one architecture");
  std::string arch = archs->elements()[0].stringValue();
  ModelConfig c;
  if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "Qwen2ForCausalLM" ||
      arch == "Qwen3ForCausalLM")
    c = readLlamaFamily(config, arch);
  else if (arch == "GPT2LMHeadModel")
    c = readGPT2(config);
  else
    throw ImportError(config.where("architectures") + ": architecture '" + arch +
                      "' is not supported (LlamaForCausalLM, MistralForCausalLM, "
                      "Qwen2ForCausalLM, Qwen3ForCausalLM, GPT2LMHeadModel)");
  // Transformers 5 writes "dtype"; 4.x "torch_dtype".
  c.torchDType = config.optionalString("dtype");
  if (!c.torchDType)
    c.torchDType = config.optionalString("torch_dtype");
  return c;
}

void checkLayerCount(const ModelConfig &config, uint64_t checkpointTensors) {
  if (uint64_t(config.layers) > checkpointTensors)
    throw ImportError("the config has " + std::to_string(config.layers) + " layers (" +
                      (config.family == Family::GPT2 ? "n_layer" : "num_hidden_layers") +
                      "), but the checkpoint has only " + std::to_string(checkpointTensors) +
                      " tensors in all");
}

std::vector<ExpectedTensor> buildForward(ModuleOp module, Type dtype, const ModelConfig &c,
                                         int64_t B, int64_t S, bool packed,
                                         const std::string &prefix) {
  if (packed && c.family == Family::GPT2)
    throw ImportError("--packed needs RoPE (the Llama family): GPT-2's learned positions do not "
                      "restart per document");
  ModelBuilder e(module, dtype);
  Builder &top = e.b;
  auto ids_t = RankedTensorType::get({B, S}, top.getI32Type());
  auto loss_t = RankedTensorType::get({}, top.getF32Type());
  e.b.setInsertionPointToEnd(module.getBody());
  llvm::SmallVector<Type> inputs = {ids_t, ids_t};
  if (packed)
    inputs.append({ids_t, ids_t}); // positions, segment_ids
  auto func =
      func::FuncOp::create(e.b, e.loc("forward"), "forward", top.getFunctionType(inputs, {loss_t}));
  Block *entry = func.addEntryBlock();
  entry->getArgument(0).setLoc(e.loc("ids"));
  entry->getArgument(1).setLoc(e.loc("labels"));
  Value positions, segmentIds;
  if (packed) {
    positions = entry->getArgument(2);
    segmentIds = entry->getArgument(3);
    positions.setLoc(e.loc("positions"));
    segmentIds.setLoc(e.loc("segment_ids"));
  }
  e.b.setInsertionPointToEnd(entry);
  Value loss = c.family == Family::GPT2
                   ? buildGPT2(e, c, B, S, entry->getArgument(0), entry->getArgument(1), prefix)
                   : buildLlama(e, c, B, S, entry->getArgument(0), entry->getArgument(1), positions,
                                segmentIds);
  func::ReturnOp::create(e.b, e.loc("return"), loss);
  return std::move(e.expected);
}

/// Every expected tensor must be in the checkpoint with the expected shape and a float dtype;
/// all problems are reported in one error. Tensors the model does not use get a note.
void checkCheckpoint(const rt::Checkpoint &checkpoint,
                     const std::vector<ExpectedTensor> &expected) {
  std::vector<std::string> missing, mismatched;
  std::set<std::string> used;
  for (const ExpectedTensor &t : expected) {
    used.insert(t.name);
    const rt::SafetensorsEntry *entry = checkpoint.find(t.name);
    if (!entry) {
      missing.push_back(t.name);
      continue;
    }
    if (entry->shape != t.shape)
      mismatched.push_back(t.name + " is " + rt::formatShape(entry->shape) + ", the config gives " +
                           rt::formatShape(t.shape));
    else if (!entry->runtimeDType || !rt::isComputeFloat(*entry->runtimeDType))
      mismatched.push_back(t.name + " has dtype " + entry->dtype +
                           ", not a float (F32, F16, BF16)");
  }
  if (!missing.empty() || !mismatched.empty()) {
    std::string message = "checkpoint '" + checkpoint.path() + "' does not match the config:";
    if (!missing.empty())
      message += " missing " + std::to_string(missing.size()) + " tensor" +
                 (missing.size() == 1 ? "" : "s") + ": " + listNames(missing) + ";";
    for (const std::string &m : mismatched)
      message += " " + m + ";";
    message.pop_back();
    throw ImportError(message);
  }
  // The tensors Hugging Face keeps but no computation reads are skipped with a note; any other
  // tensor the graph lacks would be a weight silently dropped. The list is the runtime's, so
  // that `bonsai-run --weights DIR` skips exactly the same ones.
  std::vector<std::string> extra, unknown;
  for (const rt::SafetensorsEntry &entry : checkpoint.tensors())
    if (!used.count(entry.name))
      (rt::ignoredHfTensorReason(entry.name) ? extra : unknown).push_back(entry.name);
  if (!unknown.empty())
    throw ImportError("checkpoint '" + checkpoint.path() + "' has " +
                      std::to_string(unknown.size()) + " tensor" +
                      (unknown.size() == 1 ? "" : "s") +
                      " the imported model has no parameter for: " + listNames(unknown));
  if (!extra.empty())
    printNote("ignoring " + std::to_string(extra.size()) + " checkpoint tensor" +
              (extra.size() == 1 ? "" : "s") + " the model does not use: " + listNames(extra));
}

/// The element type ("bf16", "f32", "f16") a --dtype value, a config torch_dtype or a
/// safetensors dtype names; `spelling` 0, 1 or 2 picks which of the three `name` is.
std::optional<std::string> elementType(llvm::StringRef name, int spelling) {
  static const char *const kNames[][3] = {
      {"bf16", "bfloat16", "BF16"}, {"f32", "float32", "F32"}, {"f16", "float16", "F16"}};
  for (const auto &row : kNames)
    if (name == row[spelling])
      return std::string(row[0]);
  return std::nullopt;
}

} // namespace mlir::bonsai::hf
