// The "emu" chip's device runtime, as a vendor's PyTorch extension would provide it: PyTorch's
// PrivateUse1 device type with an allocator whose memory is host RAM (so data_ptr() is a real
// host address the generated kernels can use) and the few ATen kernels every device needs to
// create tensors, copy them to and from the CPU, and view them. Every other ATen op runs
// through a boxed CPU fallback (copy to CPU, run, copy back): slow, but complete.
//
// This is emulation, not part of the Coil plugin: a real chip would ship its own runtime.
// The library has no Python module; Python loads it with torch.ops.load_library, and the
// static registrations below run at load time.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <cstring>

namespace {

constexpr c10::DeviceType kEmu = c10::DeviceType::PrivateUse1;

// Host memory, 64-byte aligned (c10::alloc_cpu), tagged with the emu device.
struct EmuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    return {data, data, &Delete, c10::Device(kEmu, 0)};
  }
  static void Delete(void* ptr) { if (ptr) c10::free_cpu(ptr); }
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

EmuAllocator emu_allocator;

// A CPU tensor over the same host memory as an emu tensor (same sizes, strides, offset), so
// CPU kernels can read and write it in place.
at::Tensor as_cpu(const at::Tensor& t) {
  if (t.device().type() != kEmu) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                       t.options().device(c10::kCPU));
}

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device>,
                               std::optional<bool>, std::optional<at::MemoryFormat> format) {
  return at::detail::empty_generic(size, &emu_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &emu_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// self -> dst, either side emu or cpu: both are host memory, so a CPU copy does it
// (any strides, any dtype conversion).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  as_cpu(dst).copy_(as_cpu(self));
  return dst;
}

// Contiguous sizes; the storage grows (new memory, old bytes copied) when it is too small.
const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size,
                          std::optional<at::MemoryFormat> format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  size_t nbytes = at::detail::computeStorageNbytesContiguous(size, impl->dtype().itemsize(),
                                                             impl->storage_offset());
  c10::StorageImpl* storage = impl->unsafe_storage().unsafeGetStorageImpl();
  if (nbytes > storage->nbytes()) {
    c10::DataPtr grown = emu_allocator.allocate(nbytes);
    if (storage->nbytes() > 0) std::memcpy(grown.get(), storage->data(), storage->nbytes());
    storage->set_data_ptr_noswap(std::move(grown));
    storage->set_nbytes(nbytes);
  }
  if (format.has_value() && *format != at::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*format);
  }
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

// A tensor over (part of) an existing storage, as copies of tensors that share memory need.
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                        at::IntArrayRef size, at::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kEmu, "set_: the storage is on ", source.device());
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  return self;
}

at::Tensor& set_whole_storage(at::Tensor& self, c10::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& fill_(at::Tensor& self, const at::Scalar& value) {
  as_cpu(self).fill_(value);
  return self;
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // A view op without an emu kernel would silently return a copy: fail instead.
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

// Device and stream bookkeeping: one device (index 0), and since every kernel finishes
// before its launch returns, events are always complete.
struct EmuGuard final : c10::impl::NoOpDeviceGuardImpl<kEmu> {
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(kEmu, 0); }
  c10::Device getDevice() const override { return c10::Device(kEmu, 0); }
  c10::Stream getStream(c10::Device) const noexcept override { return default_stream(); }
  c10::Stream exchangeStream(c10::Stream) const noexcept override { return default_stream(); }
  c10::Stream getNewStream(c10::Device, int) const override { return default_stream(); }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  static c10::Stream default_stream() { return c10::Stream(c10::Stream::DEFAULT, c10::Device(kEmu, 0)); }
};

// What PyTorch asks a device's runtime (the autograd engine, for one): one device, always
// there; random numbers come from the CPU generator (random ops run through the fallback).
struct EmuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kEmu, 0); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  // "Pinned" host memory for fast transfers: all of the chip's memory is host memory already.
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
};

EmuHooks emu_hooks;
const bool hooks_registered = (at::RegisterPrivateUse1HooksInterface(&emu_hooks), true);

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmuGuard);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &emu_allocator);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("resize_", &resize_);
  m.impl("fill_.Scalar", &fill_);
  m.impl("set_.source_Storage", &set_whole_storage);
  m.impl("set_.source_Storage_storage_offset", &set_storage);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("unfold", &at::native::unfold);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}
