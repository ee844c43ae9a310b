// Runtime registration of the op families, shared by the three family files.
//
// Nothing here runs at load time: fxmobile._C registers a family only when Python asks for it
// (fxmobile.backends.library.ensure_registered), and only if the running torch does not already
// provide it. A torch build with XNNPACK, Vulkan or Metal keeps its own ops and classes.
#pragma once

#include <c10/util/Exception.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fxmobile {

enum class Provider { kNative, kFxMobile };

// The operators and custom classes that make up one family, by qualified name
// ("prepacked::linear_clamp_run", "xnnpack.LinearOpContext").
struct FamilyNames {
  const char* family;
  std::vector<std::string> ops;
  std::vector<std::string> classes;
};

// True when torch already registers every name of the family, false when it registers none.
// A torch that has only some of them cannot be completed without clashing: that throws.
bool family_is_native(const FamilyNames& names);

// Runs `do_register` at most once per family, under a lock; returns who provides the family.
// If torch already provides it, `do_register` never runs.
Provider register_once(
    const FamilyNames& names,
    std::optional<Provider>& state,
    std::mutex& mutex,
    void (*do_register)());

Provider register_xnnpack();
Provider register_vulkan();
Provider register_metal();

} // namespace fxmobile
