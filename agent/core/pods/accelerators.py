"""Which extended resources and which Dynamic Resource Allocation (DRA) drivers are accelerators: data, one row
per device plugin (``ACCELERATORS``) and one per DRA driver (``DRA_DRIVERS``), each naming where the names come
from.

NPROC_PER_NODE follows the accelerators the trainer container asks for. A resource or a DRA driver that is not in
these tables (and is not a ``<vendor>/gpu``) is never counted silently: ``explain`` names it and says what to do.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    """``name`` is a resource name, or a prefix when it ends with ``*``."""

    name: str
    family: str
    source: str
    note: str = ""

    def matches(self, resource: str) -> bool:
        return resource.startswith(self.name[:-1]) if self.name.endswith("*") else resource == self.name


ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("nvidia.com/gpu", "NVIDIA GPU", "NVIDIA/k8s-device-plugin README (resource name)"),
    Accelerator("nvidia.com/gpu.shared", "NVIDIA GPU (time-sliced)",
                "NVIDIA/k8s-device-plugin README, sharing.timeSlicing.renameByDefault"),
    Accelerator("nvidia.com/mig-*", "NVIDIA MIG slice",
                "NVIDIA/k8s-device-plugin v0.7.0 release notes: MIG strategy mixed, e.g. nvidia.com/mig-3g.20gb"),
    Accelerator("amd.com/gpu", "AMD GPU", "ROCm/k8s-device-plugin README (resource name)"),
    Accelerator("habana.ai/gaudi", "Intel Gaudi", "HabanaAI habana-k8s-device-plugin (resource name)"),
    Accelerator("gpu.intel.com/i915", "Intel GPU (i915)",
                "intel/intel-device-plugins-for-kubernetes cmd/gpu_plugin README"),
    Accelerator("gpu.intel.com/xe", "Intel GPU (xe)",
                "intel/intel-device-plugins-for-kubernetes cmd/gpu_plugin README"),
    Accelerator("aws.amazon.com/neuroncore", "AWS NeuronCore",
                "aws-neuron neuron device plugin docs: one NeuronCore per process"),
    Accelerator("aws.amazon.com/neurondevice", "AWS Neuron device", "aws-neuron neuron device plugin docs",
                note="cores per device depend on the instance: request aws.amazon.com/neuroncore or set "
                     "--nproc-per-node"),
    Accelerator("aws.amazon.com/neuron", "AWS Neuron device", "aws-neuron neuron device plugin docs",
                note="cores per device depend on the instance: request aws.amazon.com/neuroncore or set "
                     "--nproc-per-node"),
    Accelerator("google.com/tpu", "Google TPU chip", "GKE TPU docs (resource google.com/tpu)"),
)

# Extended resources that are not devices a training process drives.
NOT_DEVICES = ("hugepages-", "ephemeral-storage", "cpu", "memory", "vpc.amazonaws.com/", "rdma/", "smarter-devices/")


@functools.lru_cache(maxsize=1024)
def accelerator_of(resource: str) -> Accelerator | None:
    """The table row for a resource; an unlisted ``<vendor>/gpu`` counts as a GPU of that vendor."""
    for row in ACCELERATORS:
        if row.matches(resource):
            return row
    vendor, _, kind = resource.rpartition("/")
    if vendor and kind == "gpu":
        return Accelerator(resource, f"{vendor} GPU", "convention: <vendor>/gpu")
    return None


def is_unknown_extended(resource: str) -> bool:
    """An extended resource (``domain/name``) that is neither a known accelerator nor a known non-device."""
    return "/" in resource and accelerator_of(resource) is None and not resource.startswith(NOT_DEVICES)


@dataclass(frozen=True)
class DraDriver:
    """A DRA driver: the ``driver`` of an allocated device (ResourceClaim ``status.allocation.devices.results``),
    and the DeviceClasses its chart installs (what a claim's request names before allocation). ``accelerator``:
    one training process per device; False: a device that is no accelerator (an IMEX channel), left out."""

    driver: str
    family: str
    accelerator: bool
    classes: tuple[str, ...]
    source: str


DRA_DRIVERS: tuple[DraDriver, ...] = (
    DraDriver("gpu.nvidia.com", "NVIDIA GPU", True, ("gpu.nvidia.com", "mig.nvidia.com"),
              "kubernetes-sigs/dra-driver-nvidia-gpu (was NVIDIA/k8s-dra-driver-gpu): driver gpu.nvidia.com, "
              "DeviceClasses gpu.nvidia.com and mig.nvidia.com (demo/specs, docs)"),
    DraDriver("compute-domain.nvidia.com", "NVIDIA ComputeDomain IMEX channel", False,
              ("compute-domain-default-channel.nvidia.com", "compute-domain-daemon.nvidia.com"),
              "kubernetes-sigs/dra-driver-nvidia-gpu: driver compute-domain.nvidia.com, the ComputeDomain's "
              "IMEX channel and daemon (templates/compute-domain-*.tmpl.yaml)"),
    DraDriver("gpu.amd.com", "AMD GPU", True, ("gpu.amd.com",),
              "ROCm/k8s-gpu-dra-driver pkg/consts/consts.go DriverName; README: DeviceClass gpu.amd.com"),
    DraDriver("gpu.intel.com", "Intel GPU", True, ("gpu.intel.com",),
              "intel/intel-resource-drivers-for-kubernetes: GPU resource driver gpu.intel.com (DeviceClass of the "
              "same name)"),
    DraDriver("gaudi.intel.com", "Intel Gaudi", True, ("gaudi.intel.com",),
              "intel/intel-resource-drivers-for-kubernetes: Gaudi resource driver gaudi.intel.com (DeviceClass of "
              "the same name)"),
    DraDriver("tpu.google.com", "Google TPU chip", True, ("tpu.google.com",),
              "kubernetes-sigs/dra-driver-google-tpu: DriverName tpu.google.com (DeviceClass of the same name)"),
)
_BY_DRIVER = {row.driver: row for row in DRA_DRIVERS}
_BY_CLASS = {name: row for row in DRA_DRIVERS for name in row.classes}


def dra_driver(driver: str) -> DraDriver | None:
    """The table row of an allocated device's driver; None: a driver the table does not know."""
    return _BY_DRIVER.get(driver)


def dra_class(device_class: str) -> DraDriver | None:
    """The table row of a DeviceClass a claim's request names; None: a class the table does not know."""
    return _BY_CLASS.get(device_class)
