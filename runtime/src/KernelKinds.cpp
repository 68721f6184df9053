//===- KernelKinds.cpp - The kernel table's entries, as runtime values ----===//
//
// Builds one KernelKindInfo per row of KernelKinds.def, once: the operand lists, spelled in the
// table as parenthesised identifiers, are stringified there and split here.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/KernelKinds.h"

#include <algorithm>
#include <stdexcept>

namespace bonsai::rt {

namespace {

using namespace kernel_traits;

/// "x, w, bias" -> {"x", "w", "bias"}; a trailing underscore (do_, for a C++ keyword) goes.
std::vector<std::string> splitNames(const char *list) {
  std::vector<std::string> names;
  std::string s(list);
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos)
      end = s.size();
    std::string name = s.substr(start, end - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!name.empty() && name.back() == '_')
      name.pop_back();
    if (!name.empty())
      names.push_back(name);
    start = end + 1;
  }
  return names;
}

/// One row: the operand lists as the table spells them, split; each output marked read-write
/// when the row's ReadWrite list names it.
KernelKindInfo entry(KernelKind kind, const char *name, const char *opName, uint32_t minInputs,
                     uint32_t minOutputs, const char *inputs, const char *outputs,
                     const char *readWrite, uint32_t traits) {
  KernelKindInfo info{kind, name, opName, minInputs, minOutputs, splitNames(inputs),
                      splitNames(outputs), {}, traits};
  info.readWrite.assign(info.outputs.size(), false);
  for (const std::string &rw : splitNames(readWrite)) {
    auto at = std::find(info.outputs.begin(), info.outputs.end(), rw);
    if (at == info.outputs.end()) // a mistake in KernelKinds.def, caught by every test
      throw std::logic_error(std::string("KernelKinds.def: ") + name + "'s ReadWrite names '" +
                             rw + "', which is not one of its outputs");
    info.readWrite[size_t(at - info.outputs.begin())] = true;
  }
  return info;
}

std::vector<KernelKindInfo> buildTable() {
  std::vector<KernelKindInfo> table;
#define BONSAI_OPERAND_NAMES(...) #__VA_ARGS__
#define BONSAI_KERNEL_KIND(Name, Value, OpName, Attrs, MinInputs, Inputs, MinOutputs, Outputs,   \
                           ReadWrite, Traits)                                                    \
  table.push_back(entry(KernelKind::Name, #Name, OpName, MinInputs, MinOutputs,                   \
                        BONSAI_OPERAND_NAMES Inputs, BONSAI_OPERAND_NAMES Outputs,                \
                        BONSAI_OPERAND_NAMES ReadWrite, Traits));
#include "bonsai/runtime/KernelKinds.def"
#undef BONSAI_OPERAND_NAMES
  return table;
}

/// The largest value of any kind, for the value -> index map.
constexpr uint32_t kMaxKindValue = std::max({0u
#define BONSAI_KERNEL_KIND(Name, Value, ...) , uint32_t(Value)
#include "bonsai/runtime/KernelKinds.def"
});

struct Index {
  std::vector<KernelKindInfo> table = buildTable();
  std::vector<int> byValue = std::vector<int>(kMaxKindValue + 1, -1);
  Index() {
    for (size_t i = 0; i < table.size(); ++i)
      byValue[size_t(table[i].kind)] = int(i);
  }
};

const Index &index() {
  static const Index instance;
  return instance;
}

} // namespace

const std::vector<KernelKindInfo> &kernelKinds() { return index().table; }

const KernelKindInfo *findKernelKind(uint32_t value) {
  const Index &i = index();
  if (value > kMaxKindValue || i.byValue[value] < 0)
    return nullptr;
  return &i.table[size_t(i.byValue[value])];
}

size_t kernelKindIndex(KernelKind kind) {
  const KernelKindInfo *info = findKernelKind(uint32_t(kind));
  if (!info) // Only a cast of an unchecked value gets here: the loader rejects unknown kinds.
    throw std::logic_error("kernelKindIndex: no kind has value " + std::to_string(unsigned(kind)));
  return size_t(info - index().table.data());
}

const KernelKindInfo &kernelKindInfo(KernelKind kind) {
  return kernelKinds()[kernelKindIndex(kind)];
}

const char *kernelKindName(KernelKind kind) {
  const KernelKindInfo *info = findKernelKind(uint32_t(kind));
  return info ? info->name : "unknown";
}

} // namespace bonsai::rt
