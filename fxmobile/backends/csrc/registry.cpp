// Detection of natively provided families and the register-once guard (see registry.h).
#include "registry.h"

#include <torch/custom_class.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <sstream>

namespace fxmobile {
namespace {

bool op_exists(const std::string& qualified_name) {
  return c10::Dispatcher::singleton().findSchema({qualified_name, ""}).has_value();
}

bool class_exists(const std::string& dotted_name) {
  return torch::getCustomClass("__torch__.torch.classes." + dotted_name) != nullptr;
}

std::string join(const std::vector<std::string>& names) {
  std::ostringstream s;
  for (size_t i = 0; i < names.size(); ++i) {
    s << (i ? ", " : "") << names[i];
  }
  return s.str();
}

} // namespace

bool family_is_native(const FamilyNames& names) {
  std::vector<std::string> present;
  std::vector<std::string> missing;
  for (const auto& op : names.ops) {
    (op_exists(op) ? present : missing).push_back(op);
  }
  for (const auto& cls : names.classes) {
    (class_exists(cls) ? present : missing).push_back(cls);
  }
  if (missing.empty()) {
    return true;
  }
  TORCH_CHECK(
      present.empty(),
      "fxmobile cannot register the ",
      names.family,
      " op family: this torch (or another extension) already registers part of it (",
      join(present),
      ") but not the rest (",
      join(missing),
      "). Registering the rest would clash with the existing definitions; use a torch build "
      "that provides the whole family, or none of it.");
  return false;
}

Provider register_once(
    const FamilyNames& names,
    std::optional<Provider>& state,
    std::mutex& mutex,
    void (*do_register)()) {
  std::lock_guard<std::mutex> guard(mutex);
  if (state) {
    return *state;
  }
  if (family_is_native(names)) {
    state = Provider::kNative;
  } else {
    do_register();
    state = Provider::kFxMobile;
  }
  return *state;
}

} // namespace fxmobile
