/* example_proc.h: bounded process and port helpers for the multi-process examples and tests
 * (C and C++; POSIX). Not part of the library API. Every wait has a time limit. */
#ifndef MOONCAKE_RS_EXAMPLE_PROC_H
#define MOONCAKE_RS_EXAMPLE_PROC_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A TCP port on 127.0.0.1 that nobody listens on right now (0 on failure). */
static inline int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr;
    socklen_t len = sizeof addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
        getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
        port = ntohs(addr.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

static inline int can_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
    if (fd >= 0) close(fd);
    return ok;
}

/* fork + execv; the child's stdout goes to *stdout_fd when it is non-NULL. */
static inline pid_t spawn(char *const argv[], int *stdout_fd) {
    int fds[2] = {-1, -1};
    if (stdout_fd != NULL && pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        if (stdout_fd != NULL) {
            dup2(fds[1], STDOUT_FILENO);
            close(fds[0]);
            close(fds[1]);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    if (stdout_fd != NULL) {
        close(fds[1]);
        *stdout_fd = fds[0];
    }
    return pid;
}

/* Sends `sig` and waits up to `limit_s` for the exit; SIGKILL after that. Returns the wait status. */
static inline int stop_child(pid_t pid, int sig, double limit_s) {
    int status = -1;
    if (pid <= 0) return status;
    kill(pid, sig);
    for (double deadline = now_s() + limit_s; now_s() < deadline; sleep_ms(20))
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return status;
}

/* Reads one line ("READY <name>") from fd within limit_s; returns 0 and the name on success. */
static inline int read_ready_line(int fd, char *name, size_t cap, double limit_s) {
    char line[512];
    size_t used = 0;
    double deadline = now_s() + limit_s;
    while (used + 1 < sizeof line && now_s() < deadline) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = read(fd, line + used, 1);
        if (n <= 0) return -1;
        if (line[used] == '\n') {
            line[used] = '\0';
            if (strncmp(line, "READY ", 6) != 0 || strlen(line + 6) + 1 > cap) return -1;
            strcpy(name, line + 6);
            return 0;
        }
        used++;
    }
    return -1;
}

/* Starts `master_bin` on a free 127.0.0.1 port (client_ttl 2 s, metrics on another free port) and
 * waits up to 10 s for the RPC port to accept. Returns the pid and *rpc_port, or -1 (nothing left
 * running). */
static inline pid_t start_master(const char *master_bin, int *rpc_port) {
    int port = free_port(), metrics_port = free_port();
    char rpc_flag[64], metrics_flag[64];
    char address_flag[] = "--rpc_address=127.0.0.1", metrics_host[] = "--metrics_host=127.0.0.1";
    char ttl_flag[] = "--client_ttl=2";
    snprintf(rpc_flag, sizeof rpc_flag, "--rpc_port=%d", port);
    snprintf(metrics_flag, sizeof metrics_flag, "--metrics_port=%d", metrics_port);
    char *argv[] = {(char *)master_bin, rpc_flag, address_flag, metrics_flag, metrics_host,
                    ttl_flag, NULL};
    pid_t pid = spawn(argv, NULL);
    for (double deadline = now_s() + 10.0; pid > 0 && now_s() < deadline; sleep_ms(20)) {
        if (can_connect(port)) {
            *rpc_port = port;
            return pid;
        }
    }
    stop_child(pid, SIGKILL, 5.0);
    return -1;
}

/* Starts `client_bin` (mooncake_client) against `master_addr` with a `segment` such as "64 MB" and
 * no local buffer; waits up to 20 s for "READY <name>". Returns the pid, the segment name and the
 * child's stdout (keep it open while the child runs; close it after stopping the child), or -1. */
/* start_peer on data address `host` over transport `protocol` on RDMA device `device`
 * ("" for TCP). */
static inline pid_t start_peer_on(const char *client_bin, const char *master_addr,
                                  const char *segment, const char *host, const char *protocol,
                                  const char *device, char *name, size_t cap, int *stdout_fd) {
    char master_flag[128], segment_flag[64], host_flag[128], protocol_flag[64], device_flag[128];
    char buffer_flag[] = "--local_buffer_size=0";
    /* No service port: tests start several peers at once; dummies attach by segment name. */
    char port_flag[] = "--port=0";
    snprintf(master_flag, sizeof master_flag, "--master_server_address=%s", master_addr);
    snprintf(segment_flag, sizeof segment_flag, "--global_segment_size=%s", segment);
    snprintf(host_flag, sizeof host_flag, "--host=%s", host);
    snprintf(protocol_flag, sizeof protocol_flag, "--protocol=%s", protocol);
    snprintf(device_flag, sizeof device_flag, "--device_name=%s", device);
    char *argv[] = {(char *)client_bin, master_flag, host_flag, port_flag, segment_flag,
                    buffer_flag, protocol_flag, device_flag, NULL};
    pid_t pid = spawn(argv, stdout_fd);
    if (pid > 0 && read_ready_line(*stdout_fd, name, cap, 20.0) == 0) return pid;
    stop_child(pid, SIGKILL, 5.0);
    if (*stdout_fd >= 0) close(*stdout_fd);
    *stdout_fd = -1;
    return -1;
}

/* A TCP peer on 127.0.0.1. */
static inline pid_t start_peer(const char *client_bin, const char *master_addr, const char *segment,
                               char *name, size_t cap, int *stdout_fd) {
    return start_peer_on(client_bin, master_addr, segment, "127.0.0.1", "tcp", "", name, cap,
                         stdout_fd);
}

#endif
