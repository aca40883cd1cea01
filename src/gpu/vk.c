/*
 * vk.c: the Vulkan side of the gpu module: the loader found at run time
 * (os/dl.c), instance and device selection, memory and buffers, one compute
 * queue, one command buffer, and a pipeline per embedded shader (vk_spv.h).
 * The Vulkan headers give only types (VK_NO_PROTOTYPES: nothing links
 * against libvulkan); every entry point comes from vkGetInstanceProcAddr.
 * Without the headers or without compiled shaders this file still builds and
 * every open fails with the reason. It must never abort on a driver's
 * answer: a failed call is an error value for the caller.
 */
#include "vk_int.h"
#include "vk_spv.h"

#include "../os/os.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool cm_gpu_compiled(void) { return cm_vk_spvs[0].name != NULL; }

int cm_gpu_parse(const char *s, int *index) {
    if (!s || !*s || !strcmp(s, "none") || !strcmp(s, "cpu")) *index = CM_GPU_NONE;
    else if (!strcmp(s, "auto")) *index = CM_GPU_AUTO;
    else if (!strcmp(s, "vulkan")) *index = CM_GPU_ANY;
    else {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end || v < 0 || v > 64) return CM_EINVAL;
        *index = (int)v;
    }
    return 0;
}

#if defined(__has_include) && !defined(CM_NO_VULKAN) /* CM_NO_VULKAN: build the stubs (a test of them) */
#if __has_include(<vulkan/vulkan_core.h>)
#define CM_VK_HEADERS 1
#endif
#endif

#ifndef CM_VK_HEADERS

int cm_gpu_list(cm_gpu_info *out, int max, char *err, size_t errlen) {
    return cm_errf(err, errlen, CM_EUNSUPPORTED, "this binary was built without the Vulkan headers (no GPU backend)");
}
int cm_gpu_open(cm_gpu **out, int index, char *err, size_t errlen) {
    *out = NULL;
    return cm_gpu_list(NULL, 0, err, errlen);
}
void cm_gpu_close(cm_gpu *g) {}
const cm_gpu_info *cm_gpu_info_of(const cm_gpu *g) { return NULL; }
cm_vk_buf *cm_vk_buf_new(cm_gpu *g, uint64_t bytes, enum cm_vk_mem kind, char *err, size_t errlen) { return NULL; }
void cm_vk_buf_free(cm_gpu *g, cm_vk_buf *b) {}
void *cm_vk_buf_map(cm_vk_buf *b) { return NULL; }
int cm_vk_upload(cm_gpu *g, cm_vk_buf *dst, uint64_t off, const void *src, uint64_t n, char *err, size_t errlen) {
    return CM_EUNSUPPORTED;
}
cm_vk_set *cm_vk_set_new(cm_gpu *g, cm_vk_buf *w, cm_vk_buf *a, cm_vk_buf *kv, char *err, size_t errlen) {
    return NULL;
}
void cm_vk_set_free(cm_gpu *g, cm_vk_set *s) {}
void cm_vk_lock(cm_gpu *g) {}
void cm_vk_unlock(cm_gpu *g) {}
int cm_vk_begin(cm_gpu *g, char *err, size_t errlen) { return CM_EUNSUPPORTED; }
void cm_vk_dispatch(cm_gpu *g, enum cm_vk_pipe p, cm_vk_set *s, const void *push, uint32_t push_bytes, uint32_t gx,
                    uint32_t gy) {}
void cm_vk_copy(cm_gpu *g, cm_vk_buf *src, uint64_t src_off, cm_vk_buf *dst, uint64_t dst_off, uint64_t n) {}
int cm_vk_submit(cm_gpu *g, char *err, size_t errlen) { return CM_EUNSUPPORTED; }
uint64_t cm_vk_max_range(const cm_gpu *g) { return 0; }
bool cm_gpu_lost(const cm_gpu *g) { return false; }
int cm_vk_fault(cm_gpu *g, char *err, size_t errlen) { return CM_EUNSUPPORTED; }
int cm_gpu_set_subgroup(cm_gpu *g, bool on, char *err, size_t errlen) { return CM_EUNSUPPORTED; }
int cm_gpu_subgroup(const cm_gpu *g) { return 0; }

#else

#define VK_NO_PROTOTYPES 1
#include <vulkan/vulkan_core.h>

/* Entry points: global (from the loader), instance, device. */
#define CM_VK_INSTANCE_FNS(X)                   \
    X(vkDestroyInstance)                        \
    X(vkEnumeratePhysicalDevices)               \
    X(vkGetPhysicalDeviceProperties)            \
    X(vkGetPhysicalDeviceMemoryProperties)      \
    X(vkGetPhysicalDeviceQueueFamilyProperties) \
    X(vkCreateDevice)                           \
    X(vkGetDeviceProcAddr)                      \
    X(vkEnumerateDeviceExtensionProperties)
#define CM_VK_DEVICE_FNS(X)          \
    X(vkDestroyDevice)               \
    X(vkGetDeviceQueue)              \
    X(vkCreateBuffer)                \
    X(vkDestroyBuffer)               \
    X(vkGetBufferMemoryRequirements) \
    X(vkAllocateMemory)              \
    X(vkFreeMemory)                  \
    X(vkBindBufferMemory)            \
    X(vkMapMemory)                   \
    X(vkCreateShaderModule)          \
    X(vkDestroyShaderModule)         \
    X(vkCreateDescriptorSetLayout)   \
    X(vkDestroyDescriptorSetLayout)  \
    X(vkCreatePipelineLayout)        \
    X(vkDestroyPipelineLayout)       \
    X(vkCreateComputePipelines)      \
    X(vkDestroyPipeline)             \
    X(vkCreateDescriptorPool)        \
    X(vkDestroyDescriptorPool)       \
    X(vkAllocateDescriptorSets)      \
    X(vkFreeDescriptorSets)          \
    X(vkUpdateDescriptorSets)        \
    X(vkCreateCommandPool)           \
    X(vkDestroyCommandPool)          \
    X(vkAllocateCommandBuffers)      \
    X(vkBeginCommandBuffer)          \
    X(vkEndCommandBuffer)            \
    X(vkResetCommandBuffer)          \
    X(vkCmdBindPipeline)             \
    X(vkCmdBindDescriptorSets)       \
    X(vkCmdPushConstants)            \
    X(vkCmdDispatch)                 \
    X(vkCmdPipelineBarrier)          \
    X(vkCmdCopyBuffer)               \
    X(vkCreateFence)                 \
    X(vkDestroyFence)                \
    X(vkResetFences)                 \
    X(vkWaitForFences)               \
    X(vkQueueSubmit)                 \
    X(vkDeviceWaitIdle)

typedef struct vk_api {
    void *lib;
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    PFN_vkCreateInstance vkCreateInstance;
#define X(f) PFN_##f f;
    CM_VK_INSTANCE_FNS(X)
    CM_VK_DEVICE_FNS(X)
#undef X
    VkInstance inst;
    uint32_t inst_api; /* the instance's API version: 1.1 where the loader has it (subgroup shaders) */
} vk_api;

struct cm_vk_buf {
    VkBuffer buf;
    VkDeviceMemory mem;
    uint64_t size;
    void *map; /* host-visible: mapped for its lifetime */
};

struct cm_vk_set {
    VkDescriptorSet set;
};

struct cm_gpu {
    vk_api vk;
    cm_gpu_info info;
    VkPhysicalDevice pd;
    VkPhysicalDeviceMemoryProperties mp;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    uint64_t max_range;
    VkDescriptorSetLayout dsl;
    VkPipelineLayout pl;
    VkPipeline pipes[VKP_COUNT]; /* each made at its first dispatch (make_pipe) */
    int pipe_rc;                 /* a pipeline that could not be made: the next submit fails with pipe_err */
    char pipe_err[256];
    VkDescriptorPool dpool;
    VkCommandPool cpool;
    VkCommandBuffer cmd;
    VkFence fence;
    pthread_mutex_t mu;
    uint32_t sg_size;  /* subgroup size with arithmetic ops in compute shaders (Vulkan 1.1), 0: none */
    bool subgroup;     /* the matmuls reduce with subgroupAdd (the *_sg shaders); else shared memory */
    _Atomic bool lost; /* VK_ERROR_DEVICE_LOST seen (or injected) */
    int n_fwd;         /* forward passes submitted (CUMULO_TEST_GPU_FAULT counts them) */
};

static const char *const pipe_names[VKP_COUNT] = {
    "mm_f32",     "mm_f16",     "mm_q8_0",  "mm_q4_0", "rmsnorm",    "rope",    "kvstore",  "attn",      "silu",
    "q8act",      "bias",       "mm_q2_k",  "mm_q3_k", "mm_q4_k",    "mm_q5_k", "mm_q6_k",  "q8kact",    "mm_q5_0",
    "gelu",       "mm_q4_1",    "mm_q5_1",  "q81act",  "moeroute",   "moesum",  "mm_mxfp4", "mm_iq4_nl", "mm_iq4_xs",
    "mm_iq2_xxs", "mm_iq3_xxs", "mm_iq1_s", "mm_bf16", "swiglu_oai", "mla",     "latround", "kvq",       "fwht"};

static int vk_fail(char *err, size_t errlen, VkResult r, const char *what) {
    const int code = r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? CM_ENOMEM : CM_EIO;
    return cm_errf(err, errlen, code, "vulkan: %s failed (VkResult %d%s)", what, (int)r,
                   r == VK_ERROR_DEVICE_LOST            ? ", device lost"
                   : r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? ", out of device memory"
                                                        : "");
}

/* Load the loader and make an instance (Vulkan 1.0; MoltenVK through the
 * portability enumeration where the loader knows it). */
static int vk_load(vk_api *vk, char *err, size_t errlen) {
    memset(vk, 0, sizeof *vk);
    if (!cm_gpu_compiled())
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "this binary has no GPU shaders (glslc was missing at build time)");
    if (!(vk->lib = cm_dl_open_vulkan(err, errlen))) return CM_ENOENT;
    void *gipa = cm_dl_sym(vk->lib, "vkGetInstanceProcAddr");
    if (!gipa) {
        cm_dl_close(vk->lib);
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "the Vulkan loader has no vkGetInstanceProcAddr");
    }
    memcpy(&vk->vkGetInstanceProcAddr, &gipa, sizeof gipa); /* object to function pointer (POSIX) */
    vk->vkCreateInstance = (PFN_vkCreateInstance)vk->vkGetInstanceProcAddr(NULL, "vkCreateInstance");
    if (!vk->vkCreateInstance) {
        cm_dl_close(vk->lib);
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "the Vulkan loader has no vkCreateInstance");
    }
    /* Vulkan 1.1 where the loader has it (a 1.0 loader refuses a higher apiVersion) */
    vk->inst_api = VK_API_VERSION_1_0;
    PFN_vkEnumerateInstanceVersion eiv =
        (PFN_vkEnumerateInstanceVersion)vk->vkGetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
    uint32_t lv = 0;
    if (eiv && eiv(&lv) == VK_SUCCESS && lv >= VK_API_VERSION_1_1) vk->inst_api = VK_API_VERSION_1_1;
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "cumulo", .apiVersion = vk->inst_api};
    const char *port_ext[] = {"VK_KHR_portability_enumeration"};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
                               .pApplicationInfo = &app,
                               .flags = 0x00000001 /* VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR */,
                               .enabledExtensionCount = 1,
                               .ppEnabledExtensionNames = port_ext};
    VkResult r = vk->vkCreateInstance(&ci, NULL, &vk->inst);
    if (r != VK_SUCCESS) { /* no portability extension: a plain instance */
        ci.flags = 0;
        ci.enabledExtensionCount = 0;
        r = vk->vkCreateInstance(&ci, NULL, &vk->inst);
    }
    if (r != VK_SUCCESS) {
        cm_dl_close(vk->lib);
        return r == VK_ERROR_INCOMPATIBLE_DRIVER ? cm_errf(err, errlen, CM_ENOENT, "no Vulkan driver on this machine")
                                                 : vk_fail(err, errlen, r, "vkCreateInstance");
    }
    int missing = 0;
#define X(f) \
    if (!(vk->f = (PFN_##f)vk->vkGetInstanceProcAddr(vk->inst, #f))) missing++;
    CM_VK_INSTANCE_FNS(X)
#undef X
    if (missing) {
        PFN_vkDestroyInstance di = (PFN_vkDestroyInstance)vk->vkGetInstanceProcAddr(vk->inst, "vkDestroyInstance");
        if (di) di(vk->inst, NULL);
        cm_dl_close(vk->lib);
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "the Vulkan loader lacks %d instance functions", missing);
    }
    return 0;
}

static void vk_unload(vk_api *vk) {
    if (vk->inst) vk->vkDestroyInstance(vk->inst, NULL);
    cm_dl_close(vk->lib);
    memset(vk, 0, sizeof *vk);
}

static void info_of(vk_api *vk, VkPhysicalDevice pd, cm_gpu_info *gi) {
    VkPhysicalDeviceProperties p;
    VkPhysicalDeviceMemoryProperties mp;
    vk->vkGetPhysicalDeviceProperties(pd, &p);
    vk->vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    memset(gi, 0, sizeof *gi);
    snprintf(gi->name, sizeof gi->name, "%s", p.deviceName);
    const char *k = p.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU     ? "discrete"
                    : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? "integrated"
                    : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU    ? "virtual"
                    : p.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU            ? "cpu"
                                                                             : "other";
    snprintf(gi->kind, sizeof gi->kind, "%s", k);
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        if ((mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[i].size > gi->mem_bytes)
            gi->mem_bytes = mp.memoryHeaps[i].size;
    gi->api = p.apiVersion;
}

enum { MAX_PD = 16 };

int cm_gpu_list(cm_gpu_info *out, int max, char *err, size_t errlen) {
    vk_api vk;
    int rc = vk_load(&vk, err, errlen);
    if (rc) return rc;
    VkPhysicalDevice pds[MAX_PD];
    uint32_t n = MAX_PD;
    VkResult r = vk.vkEnumeratePhysicalDevices(vk.inst, &n, pds);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        vk_unload(&vk);
        return vk_fail(err, errlen, r, "vkEnumeratePhysicalDevices");
    }
    for (uint32_t i = 0; i < n && (int)i < max; i++) info_of(&vk, pds[i], &out[i]);
    vk_unload(&vk);
    return (int)n;
}

static int find_mem(const cm_gpu *g, uint32_t bits, VkMemoryPropertyFlags need, VkMemoryPropertyFlags want) {
    int best = -1;
    for (uint32_t i = 0; i < g->mp.memoryTypeCount; i++) {
        const VkMemoryPropertyFlags f = g->mp.memoryTypes[i].propertyFlags;
        if (!(bits & (1u << i)) || (f & need) != need) continue;
        if ((f & want) == want) return (int)i;
        if (best < 0) best = (int)i;
    }
    return best;
}

cm_vk_buf *cm_vk_buf_new(cm_gpu *g, uint64_t bytes, enum cm_vk_mem kind, char *err, size_t errlen) {
    cm_vk_buf *b = cm_calloc(1, sizeof *b);
    if (!b) {
        cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        return NULL;
    }
    b->size = bytes ? (bytes + 15) & ~(uint64_t)15 : 16;
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .size = b->size,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = g->vk.vkCreateBuffer(g->dev, &bi, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        vk_fail(err, errlen, r, "vkCreateBuffer");
        cm_free(b);
        return NULL;
    }
    VkMemoryRequirements req;
    g->vk.vkGetBufferMemoryRequirements(g->dev, b->buf, &req);
    const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    int mt = kind == CM_VK_HOST ? find_mem(g, req.memoryTypeBits, hv, VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
                                : find_mem(g, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, hv);
    if (mt < 0 && kind == CM_VK_DEVICE) mt = find_mem(g, req.memoryTypeBits, 0, 0);
    if (mt < 0) {
        cm_vk_buf_free(g, b);
        cm_errf(err, errlen, CM_EUNSUPPORTED, "vulkan: no memory type for a %s buffer",
                kind == CM_VK_HOST ? "host" : "device");
        return NULL;
    }
    VkMemoryAllocateInfo ai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = (uint32_t)mt};
    if ((r = g->vk.vkAllocateMemory(g->dev, &ai, NULL, &b->mem)) != VK_SUCCESS ||
        (r = g->vk.vkBindBufferMemory(g->dev, b->buf, b->mem, 0)) != VK_SUCCESS) {
        vk_fail(err, errlen, r, "allocating device memory");
        cm_vk_buf_free(g, b);
        return NULL;
    }
    if ((g->mp.memoryTypes[mt].propertyFlags & hv) == hv &&
        (r = g->vk.vkMapMemory(g->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map)) != VK_SUCCESS) {
        vk_fail(err, errlen, r, "vkMapMemory");
        cm_vk_buf_free(g, b);
        return NULL;
    }
    return b;
}

void cm_vk_buf_free(cm_gpu *g, cm_vk_buf *b) {
    if (!b) return;
    if (b->buf) g->vk.vkDestroyBuffer(g->dev, b->buf, NULL);
    if (b->mem) g->vk.vkFreeMemory(g->dev, b->mem, NULL); /* unmaps */
    cm_free(b);
}

void *cm_vk_buf_map(cm_vk_buf *b) { return b ? b->map : NULL; }
uint64_t cm_vk_max_range(const cm_gpu *g) { return g->max_range; }
void cm_vk_lock(cm_gpu *g) { pthread_mutex_lock(&g->mu); }
void cm_vk_unlock(cm_gpu *g) { pthread_mutex_unlock(&g->mu); }

int cm_vk_begin(cm_gpu *g, char *err, size_t errlen) {
    VkResult r = g->vk.vkResetCommandBuffer(g->cmd, 0);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    if (r == VK_SUCCESS) r = g->vk.vkBeginCommandBuffer(g->cmd, &bi);
    return r == VK_SUCCESS ? 0 : vk_fail(err, errlen, r, "vkBeginCommandBuffer");
}

/* Everything written before is visible to everything after (compute and transfer). */
static void full_barrier(cm_gpu *g) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    const VkPipelineStageFlags st = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    g->vk.vkCmdPipelineBarrier(g->cmd, st, st, 0, 1, &mb, 0, NULL, 0, NULL);
}

static int make_pipe(cm_gpu *g, enum cm_vk_pipe p, char *err, size_t errlen);

void cm_vk_dispatch(cm_gpu *g, enum cm_vk_pipe p, cm_vk_set *s, const void *push, uint32_t push_bytes, uint32_t gx,
                    uint32_t gy) {
    /* A pipeline is compiled when first used (a driver such as lavapipe
     * takes a while per shader, and a model needs a few of the ~30); one
     * that fails leaves the recording short and its submit failing. */
    if (!g->pipes[p] && !g->pipe_rc) g->pipe_rc = make_pipe(g, p, g->pipe_err, sizeof g->pipe_err);
    if (!g->pipes[p]) return;
    g->vk.vkCmdBindPipeline(g->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pipes[p]);
    g->vk.vkCmdBindDescriptorSets(g->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, g->pl, 0, 1, &s->set, 0, NULL);
    g->vk.vkCmdPushConstants(g->cmd, g->pl, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    g->vk.vkCmdDispatch(g->cmd, gx, gy, 1);
    full_barrier(g);
}

void cm_vk_copy(cm_gpu *g, cm_vk_buf *src, uint64_t src_off, cm_vk_buf *dst, uint64_t dst_off, uint64_t n) {
    if (!n) return;
    VkBufferCopy c = {.srcOffset = src_off, .dstOffset = dst_off, .size = n};
    g->vk.vkCmdCopyBuffer(g->cmd, src->buf, dst->buf, 1, &c);
    full_barrier(g);
}

bool cm_gpu_lost(const cm_gpu *g) { return g && g->lost; }

int cm_vk_fault(cm_gpu *g, char *err, size_t errlen) {
    const char *f = cm_config_get()->test_gpu_fault;
    g->n_fwd++;
    if (g->lost) return vk_fail(err, errlen, VK_ERROR_DEVICE_LOST, "waiting for the device");
    if (!f) return 0;
    const bool lost = !strncmp(f, "lost", 4), oom = !strncmp(f, "oom", 3);
    const char *colon = strchr(f, ':');
    const int at = colon ? atoi(colon + 1) : 1;
    if ((!lost && !oom) || g->n_fwd != at) return 0;
    if (lost) g->lost = true;
    return vk_fail(err, errlen, lost ? VK_ERROR_DEVICE_LOST : VK_ERROR_OUT_OF_DEVICE_MEMORY,
                   lost ? "waiting for the device" : "vkQueueSubmit");
}

int cm_vk_submit(cm_gpu *g, char *err, size_t errlen) {
    VkResult r = g->vk.vkEndCommandBuffer(g->cmd);
    if (r != VK_SUCCESS) return vk_fail(err, errlen, r, "vkEndCommandBuffer");
    if (g->pipe_rc) return cm_errf(err, errlen, g->pipe_rc, "%s", g->pipe_err);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &g->cmd};
    if ((r = g->vk.vkResetFences(g->dev, 1, &g->fence)) != VK_SUCCESS ||
        (r = g->vk.vkQueueSubmit(g->queue, 1, &si, g->fence)) != VK_SUCCESS)
        return vk_fail(err, errlen, r, "vkQueueSubmit");
    r = g->vk.vkWaitForFences(g->dev, 1, &g->fence, VK_TRUE, UINT64_MAX);
    if (r == VK_ERROR_DEVICE_LOST) g->lost = true;
    return r == VK_SUCCESS ? 0 : vk_fail(err, errlen, r, "waiting for the device");
}

int cm_vk_upload(cm_gpu *g, cm_vk_buf *dst, uint64_t off, const void *src, uint64_t n, char *err, size_t errlen) {
    if (off + n > dst->size) return cm_errf(err, errlen, CM_ERANGE, "vulkan: upload past a buffer's end");
    if (dst->map) {
        memcpy((char *)dst->map + off, src, n);
        return 0;
    }
    enum { CHUNK = 64 << 20 };
    cm_vk_buf *st = cm_vk_buf_new(g, CM_MIN(n, (uint64_t)CHUNK), CM_VK_HOST, err, errlen);
    if (!st) return CM_ENOMEM;
    int rc = 0;
    for (uint64_t done = 0; done < n && !rc;) {
        const uint64_t k = CM_MIN(n - done, (uint64_t)CHUNK);
        memcpy(st->map, (const char *)src + done, k);
        if (!(rc = cm_vk_begin(g, err, errlen))) {
            cm_vk_copy(g, st, 0, dst, off + done, k);
            rc = cm_vk_submit(g, err, errlen);
        }
        done += k;
    }
    cm_vk_buf_free(g, st);
    return rc;
}

cm_vk_set *cm_vk_set_new(cm_gpu *g, cm_vk_buf *w, cm_vk_buf *a, cm_vk_buf *kv, char *err, size_t errlen) {
    cm_vk_set *s = cm_calloc(1, sizeof *s);
    if (!s) {
        cm_errf(err, errlen, CM_ENOMEM, "out of memory");
        return NULL;
    }
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                      .descriptorPool = g->dpool,
                                      .descriptorSetCount = 1,
                                      .pSetLayouts = &g->dsl};
    VkResult r = g->vk.vkAllocateDescriptorSets(g->dev, &ai, &s->set);
    if (r != VK_SUCCESS) {
        vk_fail(err, errlen, r, "vkAllocateDescriptorSets");
        cm_free(s);
        return NULL;
    }
    cm_vk_buf *bs[3] = {w, a, kv};
    VkDescriptorBufferInfo bis[3];
    VkWriteDescriptorSet ws[3];
    for (int i = 0; i < 3; i++) {
        bis[i] = (VkDescriptorBufferInfo){
            .buffer = bs[i]->buf, .offset = 0, .range = CM_MIN(bs[i]->size, g->max_range) & ~(uint64_t)3};
        ws[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                       .dstSet = s->set,
                                       .dstBinding = (uint32_t)i,
                                       .descriptorCount = 1,
                                       .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       .pBufferInfo = &bis[i]};
    }
    g->vk.vkUpdateDescriptorSets(g->dev, 3, ws, 0, NULL);
    return s;
}

void cm_vk_set_free(cm_gpu *g, cm_vk_set *s) {
    if (!s) return;
    g->vk.vkFreeDescriptorSets(g->dev, g->dpool, 1, &s->set);
    cm_free(s);
}

/* Pick a device: index >= 0 that one; AUTO the first GPU (discrete, then
 * integrated, then virtual); ANY also a CPU driver (lavapipe) last. */
static int pick(vk_api *vk, int index, VkPhysicalDevice *out, char *err, size_t errlen) {
    VkPhysicalDevice pds[MAX_PD];
    uint32_t n = MAX_PD;
    VkResult r = vk->vkEnumeratePhysicalDevices(vk->inst, &n, pds);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || n == 0)
        return cm_errf(err, errlen, CM_ENOENT, "no Vulkan device on this machine");
    if (index >= 0) {
        if ((uint32_t)index >= n)
            return cm_errf(err, errlen, CM_EINVAL, "no Vulkan device %d (there are %u)", index, n);
        *out = pds[index];
        return 0;
    }
    const VkPhysicalDeviceType order[] = {VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU,
                                          VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU, VK_PHYSICAL_DEVICE_TYPE_OTHER,
                                          VK_PHYSICAL_DEVICE_TYPE_CPU};
    const int kinds = index == CM_GPU_ANY ? 5 : 4;
    for (int k = 0; k < kinds; k++)
        for (uint32_t i = 0; i < n; i++) {
            VkPhysicalDeviceProperties p;
            vk->vkGetPhysicalDeviceProperties(pds[i], &p);
            if (p.deviceType == order[k]) {
                *out = pds[i];
                return 0;
            }
        }
    return cm_errf(err, errlen, CM_ENOENT, "no Vulkan GPU on this machine (only a CPU driver: --gpu vulkan uses it)");
}

static int make_device(cm_gpu *g, char *err, size_t errlen) {
    vk_api *vk = &g->vk;
    VkQueueFamilyProperties qf[16];
    uint32_t nq = 16;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(g->pd, &nq, qf);
    g->qfam = UINT32_MAX;
    for (uint32_t i = 0; i < nq && g->qfam == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) g->qfam = i;
    if (g->qfam == UINT32_MAX)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "vulkan: '%s' has no compute queue", g->info.name);
    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = g->qfam,
                                  .queueCount = 1,
                                  .pQueuePriorities = &prio};
    /* MoltenVK: a portability-subset device must have that extension enabled. */
    const char *ext[] = {"VK_KHR_portability_subset"};
    uint32_t ne = 0;
    VkExtensionProperties eps[256];
    uint32_t n_eps = 256;
    if (vk->vkEnumerateDeviceExtensionProperties(g->pd, NULL, &n_eps, eps) >= 0)
        for (uint32_t i = 0; i < n_eps; i++)
            if (!strcmp(eps[i].extensionName, ext[0])) ne = 1;
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                             .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi,
                             .enabledExtensionCount = ne,
                             .ppEnabledExtensionNames = ext};
    VkResult r = vk->vkCreateDevice(g->pd, &di, NULL, &g->dev);
    if (r != VK_SUCCESS) return vk_fail(err, errlen, r, "vkCreateDevice");
    int missing = 0;
#define X(f) \
    if (!(vk->f = (PFN_##f)vk->vkGetDeviceProcAddr(g->dev, #f))) missing++;
    CM_VK_DEVICE_FNS(X)
#undef X
    if (missing) return cm_errf(err, errlen, CM_EUNSUPPORTED, "vulkan: the driver lacks %d device functions", missing);
    vk->vkGetDeviceQueue(g->dev, g->qfam, 0, &g->queue);
    return 0;
}

/* The embedded shader of a name, or NULL. */
static const cm_vk_spv *spv_named(const char *name) {
    const cm_vk_spv *s = cm_vk_spvs;
    while (s->name && strcmp(s->name, name)) s++;
    return s->name ? s : NULL;
}

static int make_pipe(cm_gpu *g, enum cm_vk_pipe p, char *err, size_t errlen) {
    vk_api *vk = &g->vk;
    char sg[64];
    snprintf(sg, sizeof sg, "%s_sg", pipe_names[p]);
    const cm_vk_spv *s = g->subgroup && spv_named(sg) ? spv_named(sg) : spv_named(pipe_names[p]);
    static const cm_vk_spv none = {NULL, NULL, 0};
    if (!s) s = &none;
    if (!s->name)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "vulkan: shader %s is not in this binary", pipe_names[p]);
    VkShaderModuleCreateInfo mi = {
        .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = s->size, .pCode = s->code};
    VkShaderModule mod;
    VkResult r = vk->vkCreateShaderModule(g->dev, &mi, NULL, &mod);
    if (r != VK_SUCCESS) return vk_fail(err, errlen, r, "vkCreateShaderModule");
    VkComputePipelineCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                                      .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                                                .module = mod,
                                                .pName = "main"},
                                      .layout = g->pl};
    r = vk->vkCreateComputePipelines(g->dev, VK_NULL_HANDLE, 1, &ci, NULL, &g->pipes[p]);
    vk->vkDestroyShaderModule(g->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        g->pipes[p] = VK_NULL_HANDLE;
        return vk_fail(err, errlen, r, "vkCreateComputePipelines");
    }
    return 0;
}

/* The subgroup size where compute shaders have subgroupAdd (Vulkan 1.1's
 * basic and arithmetic operations in the compute stage), else 0. */
static uint32_t subgroup_size(vk_api *vk, VkPhysicalDevice pd, uint32_t dev_api) {
    if (vk->inst_api < VK_API_VERSION_1_1 || dev_api < VK_API_VERSION_1_1) return 0;
    PFN_vkGetPhysicalDeviceProperties2 gp2 =
        (PFN_vkGetPhysicalDeviceProperties2)vk->vkGetInstanceProcAddr(vk->inst, "vkGetPhysicalDeviceProperties2");
    if (!gp2) return 0;
    VkPhysicalDeviceSubgroupProperties sp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sp};
    gp2(pd, &p2);
    const VkSubgroupFeatureFlags need = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
    if (!(sp.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) || (sp.supportedOperations & need) != need) return 0;
    return sp.subgroupSize;
}

int cm_gpu_set_subgroup(cm_gpu *g, bool on, char *err, size_t errlen) {
    if (on && !g->sg_size)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "'%s' has no subgroup arithmetic in compute shaders",
                       g->info.name);
    pthread_mutex_lock(&g->mu);
    if (g->subgroup != on) { /* the pipelines with a subgroup variant are made again at their next use */
        g->vk.vkDeviceWaitIdle(g->dev);
        char sg[64];
        for (int p = 0; p < VKP_COUNT; p++) {
            snprintf(sg, sizeof sg, "%s_sg", pipe_names[p]);
            if (g->pipes[p] && spv_named(sg)) {
                g->vk.vkDestroyPipeline(g->dev, g->pipes[p], NULL);
                g->pipes[p] = VK_NULL_HANDLE;
            }
        }
        g->subgroup = on;
    }
    pthread_mutex_unlock(&g->mu);
    return 0;
}

int cm_gpu_subgroup(const cm_gpu *g) { return g && g->subgroup ? (int)g->sg_size : 0; }

/* The descriptor and pipeline layouts (the pipelines come at first use), the pools, the command buffer. */
static int make_pipelines(cm_gpu *g, char *err, size_t errlen) {
    vk_api *vk = &g->vk;
    VkDescriptorSetLayoutBinding bs[3];
    for (uint32_t i = 0; i < 3; i++)
        bs[i] = (VkDescriptorSetLayoutBinding){.binding = i,
                                               .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                               .descriptorCount = 1,
                                               .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo dli = {
        .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, .bindingCount = 3, .pBindings = bs};
    VkResult r = vk->vkCreateDescriptorSetLayout(g->dev, &dli, NULL, &g->dsl);
    if (r != VK_SUCCESS) return vk_fail(err, errlen, r, "vkCreateDescriptorSetLayout");
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = 128};
    VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                      .setLayoutCount = 1,
                                      .pSetLayouts = &g->dsl,
                                      .pushConstantRangeCount = 1,
                                      .pPushConstantRanges = &pr};
    if ((r = vk->vkCreatePipelineLayout(g->dev, &pli, NULL, &g->pl)) != VK_SUCCESS)
        return vk_fail(err, errlen, r, "vkCreatePipelineLayout");
    VkDescriptorPoolSize ps = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .descriptorCount = 3 * 1024};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                      .flags = VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT,
                                      .maxSets = 1024,
                                      .poolSizeCount = 1,
                                      .pPoolSizes = &ps};
    if ((r = vk->vkCreateDescriptorPool(g->dev, &dpi, NULL, &g->dpool)) != VK_SUCCESS)
        return vk_fail(err, errlen, r, "vkCreateDescriptorPool");
    VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = g->qfam};
    if ((r = vk->vkCreateCommandPool(g->dev, &cpi, NULL, &g->cpool)) != VK_SUCCESS)
        return vk_fail(err, errlen, r, "vkCreateCommandPool");
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .commandPool = g->cpool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                       .commandBufferCount = 1};
    if ((r = vk->vkAllocateCommandBuffers(g->dev, &cai, &g->cmd)) != VK_SUCCESS)
        return vk_fail(err, errlen, r, "vkAllocateCommandBuffers");
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = vk->vkCreateFence(g->dev, &fi, NULL, &g->fence)) != VK_SUCCESS)
        return vk_fail(err, errlen, r, "vkCreateFence");
    return 0;
}

int cm_gpu_open(cm_gpu **out, int index, char *err, size_t errlen) {
    *out = NULL;
    if (index == CM_GPU_NONE) return cm_errf(err, errlen, CM_EINVAL, "no GPU asked for");
    cm_gpu *g = cm_calloc(1, sizeof *g);
    if (!g) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    pthread_mutex_init(&g->mu, NULL);
    int rc = vk_load(&g->vk, err, errlen);
    if (rc) {
        pthread_mutex_destroy(&g->mu);
        cm_free(g);
        return rc;
    }
    if (!(rc = pick(&g->vk, index, &g->pd, err, errlen))) {
        info_of(&g->vk, g->pd, &g->info);
        g->vk.vkGetPhysicalDeviceMemoryProperties(g->pd, &g->mp);
        VkPhysicalDeviceProperties p;
        g->vk.vkGetPhysicalDeviceProperties(g->pd, &p);
        g->max_range = p.limits.maxStorageBufferRange;
        g->sg_size = subgroup_size(&g->vk, g->pd, p.apiVersion);
        g->subgroup = g->sg_size > 0 && cm_config_get()->gpu_subgroup;
        rc = make_device(g, err, errlen);
    }
    if (!rc) rc = make_pipelines(g, err, errlen);
    if (rc) {
        cm_gpu_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

void cm_gpu_close(cm_gpu *g) {
    if (!g) return;
    vk_api *vk = &g->vk;
    if (g->dev) {
        vk->vkDeviceWaitIdle(g->dev);
        if (g->fence) vk->vkDestroyFence(g->dev, g->fence, NULL);
        if (g->cpool) vk->vkDestroyCommandPool(g->dev, g->cpool, NULL);
        if (g->dpool) vk->vkDestroyDescriptorPool(g->dev, g->dpool, NULL);
        for (int p = 0; p < VKP_COUNT; p++)
            if (g->pipes[p]) vk->vkDestroyPipeline(g->dev, g->pipes[p], NULL);
        if (g->pl) vk->vkDestroyPipelineLayout(g->dev, g->pl, NULL);
        if (g->dsl) vk->vkDestroyDescriptorSetLayout(g->dev, g->dsl, NULL);
        vk->vkDestroyDevice(g->dev, NULL);
    }
    vk_unload(vk);
    pthread_mutex_destroy(&g->mu);
    cm_free(g);
}

const cm_gpu_info *cm_gpu_info_of(const cm_gpu *g) { return g ? &g->info : NULL; }

#endif /* CM_VK_HEADERS */
