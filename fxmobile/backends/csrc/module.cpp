// Python entry point of fxmobile._C.
//
// Importing the module registers nothing. It exposes one function,
//   register_family(name: str) -> str
// which registers the "xnnpack", "vulkan" or "metal" op family (once) unless torch already
// provides it, and answers "native" or "fxmobile". The first call also registers the
// fxmobile:: debug ops of kernel_paths.h. Plain CPython API, no pybind11: the module
// is tiny and this keeps its build fast.
#include <Python.h>

#include <c10/util/Exception.h>

#include <cstring>
#include <exception>

#include "kernel_paths.h"
#include "registry.h"

namespace {

PyObject* register_family(PyObject* /*self*/, PyObject* arg) {
  if (!PyUnicode_Check(arg)) {
    PyErr_SetString(PyExc_TypeError, "register_family() expects a family name (str)");
    return nullptr;
  }
  const char* name = PyUnicode_AsUTF8(arg);
  if (name == nullptr) {
    return nullptr;
  }
  fxmobile::Provider provider;
  try {
    fxmobile::register_kernel_path_ops();
    if (std::strcmp(name, "xnnpack") == 0) {
      provider = fxmobile::register_xnnpack();
    } else if (std::strcmp(name, "vulkan") == 0) {
      provider = fxmobile::register_vulkan();
    } else if (std::strcmp(name, "metal") == 0) {
      provider = fxmobile::register_metal();
    } else {
      PyErr_Format(
          PyExc_ValueError,
          "unknown op family %R; expected 'xnnpack', 'vulkan' or 'metal'",
          arg);
      return nullptr;
    }
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  return PyUnicode_FromString(provider == fxmobile::Provider::kNative ? "native" : "fxmobile");
}

PyMethodDef methods[] = {
    {"register_family",
     register_family,
     METH_O,
     "register_family(name) -> 'native' | 'fxmobile'\n\n"
     "Registers the op family `name` ('xnnpack', 'vulkan' or 'metal') unless torch already\n"
     "provides it; idempotent and thread-safe."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "fxmobile._C",
    "fxmobile's operator library: XNNPACK, Vulkan and Metal prepacked ops with CPU kernels.",
    -1,
    methods,
    nullptr,
    nullptr,
    nullptr,
    nullptr};

} // namespace

PyMODINIT_FUNC PyInit__C() {
  return PyModule_Create(&module_def);
}
