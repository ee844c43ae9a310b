// The register-once guard and the check for natively provided families (see registry.h).
#include "registry.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstring>
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

Family::Family(const char* name, const char* op_namespace, void (*declare)(Family&))
    : name_(name), namespace_(op_namespace) {
  declare(*this);
}

Family& Family::add_op(
    const char* schema,
    std::function<torch::CppFunction()> make_kernel,
    bool cpu_only) {
  const char* paren = std::strchr(schema, '(');
  TORCH_CHECK(paren != nullptr, "fxmobile: not an operator schema: ", schema);
  std::string name(schema, paren);
  TORCH_CHECK(
      name.rfind(std::string(namespace_) + "::", 0) == 0,
      "fxmobile: the ",
      name_,
      " family's operators are in ",
      namespace_,
      "::, got ",
      name);
  ops_.push_back(Op{schema, std::move(name), std::move(make_kernel), cpu_only});
  return *this;
}

// True when torch already registers every name of the family, false when it registers none.
bool Family::is_native() const {
  std::vector<std::string> present;
  std::vector<std::string> missing;
  for (const auto& op : ops_) {
    (op_exists(op.name) ? present : missing).push_back(op.name);
  }
  for (const auto& cls : classes_) {
    (class_exists(cls) ? present : missing).push_back(cls);
  }
  if (missing.empty()) {
    return true;
  }
  TORCH_CHECK(
      present.empty(),
      "fxmobile cannot register the ",
      name_,
      " op family: this torch (or another extension) already registers part of it (",
      join(present),
      ") but not the rest (",
      join(missing),
      "). Registering the rest would clash with the existing definitions; use a torch build "
      "that provides the whole family, or none of it.");
  return false;
}

void Family::do_register() {
  // Classes first: the schemas name them.
  for (const auto& register_class : class_registrations_) {
    register_class();
  }
  def_library_ = std::make_unique<torch::Library>(
      torch::Library::DEF, namespace_, std::nullopt, __FILE__, __LINE__);
  cpu_library_ = std::make_unique<torch::Library>(
      torch::Library::IMPL, namespace_, c10::DispatchKey::CPU, __FILE__, __LINE__);
  for (const auto& op : ops_) {
    if (op.cpu_only) {
      def_library_->def(op.schema.c_str());
      cpu_library_->impl(op.name.c_str() + std::strlen(namespace_) + 2, op.make_kernel());
    } else {
      def_library_->def(op.schema.c_str(), op.make_kernel());
    }
  }
}

Provider Family::register_once() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (!provider_) {
    if (is_native()) {
      provider_ = Provider::kNative;
    } else {
      do_register();
      provider_ = Provider::kFxMobile;
    }
  }
  return *provider_;
}

} // namespace fxmobile
