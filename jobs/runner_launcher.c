/*
 * The runner bundle's entry point: starts the frozen runner (app/pkobatch-runner, PyInstaller's
 * bootloader) through the dynamic loader and C library the bundle carries in lib/, so the
 * runner starts in any Linux image of the bundle's architecture whatever its own C library:
 * an older glibc, musl (Alpine), or none at all (distroless, scratch + static binaries).
 *
 * Built static (jobs/build-runner-bundle.sh), so it needs nothing from the image either. It
 * only computes paths and execs: the runner keeps this process id, so the kubelet's SIGTERM
 * reaches it directly. --inhibit-cache keeps the image's /etc/ld.so.cache, made for another C
 * library, out of the search.
 *
 * The bundle's libraries are found through LD_LIBRARY_PATH, not the loader's --library-path:
 * PyInstaller's bootloader restarts itself once through the same loader to add its own
 * directory to LD_LIBRARY_PATH, and only an environment variable survives that restart. The
 * image's own value is kept in PKOBATCH_IMAGE_LD_LIBRARY_PATH (empty: it had none), and the
 * runner puts it back before it starts any program (jobs/runner_bundle_entry.py), so pulumi,
 * git and the language hosts load the image's libraries, never the bundle's.
 *
 * BUNDLE_LOADER is the loader's file name (ld-linux-x86-64.so.2 on x86-64), set by the build.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef BUNDLE_LOADER
#error "build with -DBUNDLE_LOADER=\"<file name of the dynamic loader in lib/>\""
#endif

static void fail(const char *what, const char *path) {
    fprintf(stderr, "pkobatch-runner: %s %s: %s (the bundle directory is incomplete: copy all of it)\n",
            what, path, strerror(errno));
    exit(127);
}

int main(int argc, char **argv) {
    char dir[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (length < 0) fail("cannot read", "/proc/self/exe");
    dir[length] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash == NULL) fail("unexpected path", dir);
    *slash = '\0';

    static char loader[PATH_MAX], libraries[2 * PATH_MAX], app[PATH_MAX];
    if (snprintf(loader, sizeof loader, "%s/lib/%s", dir, BUNDLE_LOADER) >= (int)sizeof loader ||
        snprintf(libraries, sizeof libraries, "%s/lib:%s/app/_internal", dir, dir) >=
            (int)sizeof libraries ||
        snprintf(app, sizeof app, "%s/app/pkobatch-runner", dir) >= (int)sizeof app) {
        errno = ENAMETOOLONG;
        fail("path too long:", dir);
    }

    const char *image_libraries = getenv("LD_LIBRARY_PATH");
    if (setenv("PKOBATCH_IMAGE_LD_LIBRARY_PATH", image_libraries ? image_libraries : "", 1) != 0 ||
        setenv("LD_LIBRARY_PATH", libraries, 1) != 0)
        fail("cannot set the environment for", app);

    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (args == NULL) fail("cannot allocate arguments for", app);
    int n = 0;
    args[n++] = loader;
    args[n++] = "--inhibit-cache";
    args[n++] = app;
    for (int i = 1; i < argc; i++) args[n++] = argv[i];
    args[n] = NULL;
    execv(loader, args);
    fail("cannot start", loader);
    return 127;
}
