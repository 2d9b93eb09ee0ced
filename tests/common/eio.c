/* An I/O error on demand, for tests/store_disk.rs: preloaded into fencegate
 * (LD_PRELOAD), it makes fsync and fdatasync fail with EIO while the file
 * named by $EIO_TRIGGER exists. Every durable write (a blob, an index or
 * fence-store commit) then fails as a dying disk would make it fail. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

static int failing(void) {
    const char *trigger = getenv("EIO_TRIGGER");
    struct stat st;
    return trigger != NULL && stat(trigger, &st) == 0;
}

int fsync(int fd) {
    static int (*real)(int);
    if (failing()) {
        errno = EIO;
        return -1;
    }
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (failing()) {
        errno = EIO;
        return -1;
    }
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
