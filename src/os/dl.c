/*
 * dl.c: the run-time loader of optional system libraries (today the Vulkan
 * loader), so the one binary runs on machines without them. The platform's
 * library names live here, not in the modules that use them.
 */
#include "os.h"

#include "../base/base.h"

#include <dlfcn.h>
#include <stdlib.h>

void *cm_dl_open_vulkan(char *err, size_t errlen) {
    const char *env = cm_config_get()->vulkan_lib; /* a loader elsewhere (tests, odd installs) */
#if defined(__APPLE__)
    static const char *const names[] = {"libvulkan.1.dylib",
                                        "libvulkan.dylib",
                                        "libMoltenVK.dylib",
                                        "/usr/local/lib/libvulkan.1.dylib",
                                        "/opt/homebrew/lib/libvulkan.1.dylib",
                                        "/opt/homebrew/lib/libMoltenVK.dylib"};
#else
    static const char *const names[] = {"libvulkan.so.1", "libvulkan.so"};
#endif
    if (env && *env) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h) cm_errf(err, errlen, CM_ENOENT, "cannot load the Vulkan loader '%s': %s", env, dlerror());
        return h;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    cm_errf(err, errlen, CM_ENOENT, "no Vulkan loader (%s) on this machine", names[0]);
    return NULL;
}

void *cm_dl_sym(void *lib, const char *name) { return lib ? dlsym(lib, name) : NULL; }

void cm_dl_close(void *lib) {
    if (lib) dlclose(lib);
}
