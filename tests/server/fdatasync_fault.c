/* An LD_PRELOAD shim that makes fdatasync fail as a dying disk does (tests/server/test_disk_failures.py).
 *
 * The control file named by $KESTREL_TEST_FDATASYNC_CONTROL holds "<count> <path part>": the next
 * <count> calls of fdatasync on a file whose path contains <path part> fail with EIO (-1: every
 * call; 0: none). Each failure also cuts the file back to its size at its last fdatasync that
 * succeeded here: what a crash finds once Linux has reported a writeback error and dropped the
 * dirty pages (it reports the error once; a later fdatasync succeeds without writing them).
 * With no such size known (no fdatasync of that file succeeded yet), the file is left as it is.
 * Each fdatasync that succeeds on a file whose path contains <path part> writes the file's size
 * to "<control file>.synced", so that a test can wait for a periodic fdatasync. Both files are
 * replaced whole (written beside, then renamed), as the test writes the control file, so that
 * neither side ever reads one half written.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILES 512

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct { dev_t dev; ino_t ino; off_t size; } synced[FILES];
static int known;

/* Replace the file at path by text: written beside it, then renamed over it. */
static void replace_file(const char *path, const char *text) {
    char beside[4200];
    snprintf(beside, sizeof beside, "%s.shim-tmp", path);
    FILE *out = fopen(beside, "w");
    if (out == NULL) return;
    fputs(text, out);
    if (fclose(out) == 0) rename(beside, path);
}

/* 1: this call fails; 0: it goes ahead, on a file the control file names; -1: on another file */
static int take_failure(int fd) {
    const char *control = getenv("KESTREL_TEST_FDATASYNC_CONTROL");
    char text[4200], path[4096], link[64];
    long count;
    int part_at = 0, fail = 0;
    if (control == NULL) return -1;
    int cfd = open(control, O_RDONLY);
    if (cfd < 0) return -1;
    ssize_t got = read(cfd, text, sizeof text - 1);
    close(cfd);
    if (got <= 0) return -1;
    text[got] = '\0';
    if (sscanf(text, "%ld %n", &count, &part_at) < 1) return -1;
    char *part = text + part_at;
    part[strcspn(part, "\n")] = '\0';
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, path, sizeof path - 1);
    if (len < 0) return -1;
    path[len] = '\0';
    if (*part != '\0' && strstr(path, part) == NULL) return -1;
    if (count == 0) return 0;
    fail = 1;
    if (count > 0) {
        char left[4200];
        snprintf(left, sizeof left, "%ld %s\n", count - 1, part);
        replace_file(control, left);
    }
    return fail;
}

static int slot(struct stat *st) {
    for (int i = 0; i < known; i++)
        if (synced[i].dev == st->st_dev && synced[i].ino == st->st_ino) return i;
    return -1;
}

int fdatasync(int fd) {
    static int (*real)(int);
    struct stat st;
    int result, named;
    pthread_mutex_lock(&lock);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    named = take_failure(fd);
    if (named == 1) {
        if (fstat(fd, &st) == 0) {
            int i = slot(&st);
            if (i >= 0 && st.st_size > synced[i].size) ftruncate(fd, synced[i].size);
        }
        pthread_mutex_unlock(&lock);
        errno = EIO;
        return -1;
    }
    pthread_mutex_unlock(&lock);
    result = real(fd);
    if (result == 0 && fstat(fd, &st) == 0) {
        pthread_mutex_lock(&lock);
        int i = slot(&st);
        if (i < 0 && known < FILES) i = known++;
        if (i >= 0) {
            synced[i].dev = st.st_dev;
            synced[i].ino = st.st_ino;
            synced[i].size = st.st_size;
        }
        const char *control = getenv("KESTREL_TEST_FDATASYNC_CONTROL");
        if (named == 0 && control != NULL) {
            char report[4200], size[32];
            snprintf(report, sizeof report, "%s.synced", control);
            snprintf(size, sizeof size, "%lld\n", (long long)st.st_size);
            replace_file(report, size);
        }
        pthread_mutex_unlock(&lock);
    }
    return result;
}
