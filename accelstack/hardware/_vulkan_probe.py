"""Enumerate Vulkan physical devices through the Vulkan loader (libvulkan.so.1) and print them as JSON.

Detection runs this file's text as ``python3 -I -c <text>`` (see ``vulkan.py``): a driver that
crashes or hangs while the loader initialises it takes down this child, not detection, and the
command's output is what a capture records and a replay plays back. It therefore uses only the
standard library, imports nothing from accelstack, and must keep working on old Python 3. Changing
this text changes the recorded command line (captures made before no longer match it).

Output: {"loader": "1.3.239", "devices": [{"index", "name", "type", "vendor_id", "device_id",
"api_version", "driver_version", "driver_id", "driver_name", "driver_info", "heaps": [{"size",
"device_local"}]}], "error": ""}; integers are raw Vulkan values, decoded by the parent.
"""
import ctypes
import json
import sys

u32 = ctypes.c_uint32
ptr = ctypes.c_void_p


class AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ptr), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", u32), ("pEngineName", ctypes.c_char_p), ("engineVersion", u32),
                ("apiVersion", u32)]


class InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ptr), ("flags", u32), ("pApplicationInfo", ctypes.POINTER(AppInfo)),
                ("enabledLayerCount", u32), ("ppEnabledLayerNames", ptr), ("enabledExtensionCount", u32),
                ("ppEnabledExtensionNames", ptr)]


class Props(ctypes.Structure):  # VkPhysicalDeviceProperties: the head, then room for limits and sparse properties
    _fields_ = [("apiVersion", u32), ("driverVersion", u32), ("vendorID", u32), ("deviceID", u32),
                ("deviceType", ctypes.c_int), ("deviceName", ctypes.c_char * 256), ("uuid", ctypes.c_ubyte * 16),
                ("rest", ctypes.c_ubyte * 2048)]


class DriverProps(ctypes.Structure):  # VkPhysicalDeviceDriverProperties (Vulkan 1.2)
    _fields_ = [("sType", ctypes.c_int), ("pNext", ptr), ("driverID", ctypes.c_int), ("driverName", ctypes.c_char * 256),
                ("driverInfo", ctypes.c_char * 256), ("conformance", ctypes.c_ubyte * 4)]


class Props2(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ptr), ("properties", Props)]


class Heap(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64), ("flags", u32)]


class MemoryProps(ctypes.Structure):
    _fields_ = [("typeCount", u32), ("types", u32 * 64), ("heapCount", u32), ("heaps", Heap * 16)]


def text(raw):
    return raw.decode("utf-8", "replace")


def probe():
    try:
        vk = ctypes.CDLL("libvulkan.so.1")
    except OSError as exc:
        return {"error": "cannot load libvulkan.so.1: %s" % exc}
    loader = 1 << 22  # Vulkan 1.0 loaders have no vkEnumerateInstanceVersion
    if hasattr(vk, "vkEnumerateInstanceVersion"):
        version = u32(0)
        if vk.vkEnumerateInstanceVersion(ctypes.byref(version)) == 0:
            loader = version.value
    devices = []  # type: list
    out = {"loader": "%d.%d.%d" % (loader >> 22, (loader >> 12) & 0x3FF, loader & 0xFFF), "devices": devices, "error": ""}
    api = (1 << 22) | (1 << 12) if loader >= (1 << 22) | (1 << 12) else 1 << 22  # ask for 1.1 when the loader has it
    app = AppInfo(0, None, b"accelstack-detect", 1, b"accelstack", 1, api)
    info = InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ptr()
    vk.vkCreateInstance.argtypes = [ctypes.POINTER(InstanceInfo), ptr, ctypes.POINTER(ptr)]
    status = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if status != 0:
        out["error"] = "vkCreateInstance returned %d" % status
        return out
    try:
        vk.vkEnumeratePhysicalDevices.argtypes = [ptr, ctypes.POINTER(u32), ptr]
        count = u32(0)
        status = vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ptr * max(count.value, 1))()
        if status in (0, 5):  # VK_SUCCESS, VK_INCOMPLETE
            status = vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        if status not in (0, 5):
            out["error"] = "vkEnumeratePhysicalDevices returned %d" % status
            return out
        for index in range(count.value):
            devices.append(device(vk, handles[index], index, api))
    finally:
        vk.vkDestroyInstance.argtypes = [ptr, ptr]
        vk.vkDestroyInstance(instance, None)
    return out


def device(vk, handle, index, api):
    props = Props()
    vk.vkGetPhysicalDeviceProperties.argtypes = [ptr, ctypes.POINTER(Props)]
    vk.vkGetPhysicalDeviceProperties(handle, ctypes.byref(props))
    entry = {"index": index, "name": text(props.deviceName), "type": props.deviceType, "vendor_id": props.vendorID,
             "device_id": props.deviceID, "api_version": props.apiVersion, "driver_version": props.driverVersion,
             "driver_id": 0, "driver_name": "", "driver_info": "", "heaps": []}
    if api >= (1 << 22) | (1 << 12) and props.apiVersion >= (1 << 22) | (2 << 12):  # driver properties: Vulkan 1.2
        driver = DriverProps(1000196000, None)
        both = Props2(1000059001, ctypes.cast(ctypes.pointer(driver), ptr))
        vk.vkGetPhysicalDeviceProperties2.argtypes = [ptr, ctypes.POINTER(Props2)]
        vk.vkGetPhysicalDeviceProperties2(handle, ctypes.byref(both))
        entry.update(driver_id=driver.driverID, driver_name=text(driver.driverName), driver_info=text(driver.driverInfo))
    memory = MemoryProps()
    vk.vkGetPhysicalDeviceMemoryProperties.argtypes = [ptr, ctypes.POINTER(MemoryProps)]
    vk.vkGetPhysicalDeviceMemoryProperties(handle, ctypes.byref(memory))
    for heap in memory.heaps[:min(memory.heapCount, 16)]:
        entry["heaps"].append({"size": heap.size, "device_local": bool(heap.flags & 1)})
    return entry


def main():
    try:
        out = probe()
    except Exception as exc:  # a loader or driver that misbehaves without crashing
        out = {"error": "%s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
