/* A closed-loop HTTP/1.1 load client in C for streamed answers: the fleet drill's client.
 *
 * Why C: the suites' client (bench/client.py, aiohttp, every chunk parsed as JSON) costs
 * tens of microseconds a chunk; at 1,024 GPU-speed streams it took more of the drill's
 * 2-vCPU box than the relay it measured. This one reads each chunk in one syscall and
 * looks at its bytes only, so the box's cores go to the system under test.
 *
 * It keeps --concurrency keep-alive connections busy until --requests requests are done:
 * each connection POSTs the --body-file body to --path, reads the answer (chunked or
 * with a Content-Length) and sends the next. Per request it prints one line to stdout:
 *
 *   index start e2e ttft status chunks completion_tokens t1 t2 ...
 *
 * times in seconds (start from the run's origin; e2e, ttft and the t's from the start),
 * ttft and the t's at each SSE event whose "content" or "text" string is not empty
 * ("-" where there was none), completion_tokens from a usage object (-1 without one),
 * status 0 where no answer came (the reason on stderr). A request that takes longer than
 * --timeout-s is cut (status 0) and its connection replaced. A 429 or 503 answer with a
 * Retry-After header holds its connection's next request that long, as the SDKs do.
 *
 * Usage: sse_client --port P --body-file F [--host 127.0.0.1] [--path /v1/chat/completions]
 *                   [--concurrency 1] [--requests 1] [--timeout-s 120] [--spread-ms 0]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_TIMES 65536

enum { HEAD, SIZE, DATA, CRLF, TRAILER, SIZED, DONE };

typedef struct {
    int fd, index, connected, status;
    double start, ttft, begin_at;
    /* what was read, not yet taken as a head, a chunk size or body bytes */
    char *raw;
    size_t raw_len, raw_cap;
    /* the body so far (chunked framing removed), and how far events were scanned */
    char *body;
    size_t body_len, body_cap, scanned;
    int state, chunked, crlf_left, retried, waiting;
    double retry_after;
    long content_length, chunk_left;
    int n_times, tokens;
    double *times;
    size_t sent;
} Conn;

static const char *host = "127.0.0.1", *path = "/v1/chat/completions";
static int port, concurrency = 1, requests = 1;
static double timeout_s = 120, spread_ms = 0;
static char *request;
static size_t request_len;
static int next_index, finished;
static int epfd;
static struct sockaddr_in addr;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double origin;

static void grow(char **data, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t cap2 = *cap ? *cap : 16384;
    while (cap2 < need) cap2 *= 2;
    *data = realloc(*data, cap2);
    if (!*data) abort();
    *cap = cap2;
}

static void report(Conn *c, const char *why) {
    double e2e = now_s() - c->start;
    if (why) fprintf(stderr, "sse_client: request %d: %s\n", c->index, why);
    printf("%d %.6f %.6f ", c->index, c->start - origin, e2e);
    if (c->n_times) printf("%.6f", c->ttft);
    else printf("-");
    printf(" %d %d %d", why ? 0 : c->status, c->n_times, c->tokens);
    for (int i = 0; i < c->n_times; i++) printf(" %.6f", c->times[i]);
    printf("\n");
    finished++;
}

static int open_conn(Conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) != 0 && errno != EINPROGRESS) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);
    c->connected = 0;
    return 0;
}

static void drop_conn(Conn *c) {
    if (c->fd >= 0) {
        epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
}

static void reset_answer(Conn *c) {
    c->raw_len = c->body_len = c->scanned = 0;
    c->state = HEAD;
    c->chunked = c->retried = 0;
    c->retry_after = 0;
    c->content_length = -1;
    c->chunk_left = 0;
    c->n_times = 0;
    c->tokens = -1;
    c->status = 0;
    c->sent = 0;
}

/* Start the next request on c, if any is left; else close c. */
static void begin(Conn *c) {
    if (next_index >= requests) {
        drop_conn(c);
        return;
    }
    c->index = next_index++;
    reset_answer(c);
    c->start = now_s();
    if (c->fd < 0 && open_conn(c) != 0) {
        report(c, "connect failed");
        begin(c);
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

static void fail(Conn *c, const char *why) {
    report(c, why);
    drop_conn(c);
    begin(c);
}

/* Note every whole SSE event of the body: its arrival when it carries text, usage. */
static void scan_events(Conn *c, double at) {
    for (;;) {
        char *from = c->body + c->scanned;
        char *end = memmem(from, c->body_len - c->scanned, "\n\n", 2);
        if (!end) return;
        size_t len = (size_t)(end - from);
        static const char *keys[] = {"\"content\":\"", "\"text\":\""};
        for (int k = 0; k < 2; k++) {
            char *v = memmem(from, len, keys[k], strlen(keys[k]));
            if (v && v + strlen(keys[k]) < end && v[strlen(keys[k])] != '"') {
                if (c->n_times == 0) c->ttft = at - c->start;
                if (c->n_times < MAX_TIMES) c->times[c->n_times++] = at - c->start;
                break;
            }
        }
        char *u = memmem(from, len, "\"completion_tokens\":", 20);
        if (u) c->tokens = atoi(u + 20);
        c->scanned += len + 2;
    }
}

/* Take what c->raw holds: the head, then the body (chunked or sized). */
static void take(Conn *c, double at) {
    size_t pos = 0;
    if (c->state == HEAD) {
        char *end = memmem(c->raw, c->raw_len, "\r\n\r\n", 4);
        if (!end) return;
        c->status = atoi(c->raw + 9);
        for (char *p = c->raw; p < end; p++) {
            if (p != c->raw && p[-1] != '\n') continue;
            if (strncasecmp(p, "transfer-encoding: chunked", 26) == 0) c->chunked = 1;
            if (strncasecmp(p, "content-length:", 15) == 0) c->content_length = atol(p + 15);
            if (strncasecmp(p, "retry-after:", 12) == 0) c->retry_after = atof(p + 12);
        }
        pos = (size_t)(end - c->raw) + 4;
        c->state = c->chunked ? SIZE : SIZED;
        if (c->state == SIZED && c->content_length <= 0) c->state = DONE;
    }
    while (pos < c->raw_len && c->state != DONE) {
        size_t have = c->raw_len - pos;
        if (c->state == SIZE) {
            char *eol = memmem(c->raw + pos, have, "\r\n", 2);
            if (!eol) break;
            c->chunk_left = strtol(c->raw + pos, NULL, 16);
            pos = (size_t)(eol - c->raw) + 2;
            c->state = c->chunk_left > 0 ? DATA : TRAILER;
            c->crlf_left = 2;
        } else if (c->state == DATA || c->state == SIZED) {
            size_t n = have;
            if (c->state == DATA && n > (size_t)c->chunk_left) n = (size_t)c->chunk_left;
            grow(&c->body, &c->body_cap, c->body_len + n);
            memcpy(c->body + c->body_len, c->raw + pos, n);
            c->body_len += n;
            pos += n;
            if (c->state == SIZED) {
                if ((long)c->body_len >= c->content_length) c->state = DONE;
            } else if ((c->chunk_left -= (long)n) == 0) {
                c->state = CRLF;
            }
        } else { /* CRLF after a chunk's data, or the last chunk's (no trailers) */
            size_t n = have < (size_t)c->crlf_left ? have : (size_t)c->crlf_left;
            pos += n;
            c->crlf_left -= (int)n;
            if (c->crlf_left == 0) c->state = c->state == TRAILER ? DONE : SIZE;
        }
    }
    memmove(c->raw, c->raw + pos, c->raw_len - pos);
    c->raw_len -= pos;
    scan_events(c, at);
}

static void on_event(Conn *c, uint32_t events) {
    if (!c->connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            fail(c, strerror(err));
            return;
        }
        c->connected = 1;
    }
    if (c->sent < request_len && (events & EPOLLOUT)) {
        ssize_t n = write(c->fd, request + c->sent, request_len - c->sent);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            fail(c, strerror(errno));
            return;
        }
        if (n > 0) c->sent += (size_t)n;
        if (c->sent == request_len) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
            epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
        }
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    for (;;) {
        grow(&c->raw, &c->raw_cap, c->raw_len + 65536);
        ssize_t n = read(c->fd, c->raw + c->raw_len, 65536);
        if (n > 0) {
            c->raw_len += (size_t)n;
            take(c, now_s());
            if (c->state == DONE) {
                report(c, NULL);
                if ((c->status == 429 || c->status == 503) && c->retry_after > 0) {
                    /* as an SDK does: this connection's next request after Retry-After */
                    c->waiting = 1;
                    c->begin_at = now_s() + c->retry_after;
                    return;
                }
                begin(c);
                return;
            }
            if (n < 65536) return;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        /* EOF or an error mid-answer; before any byte, a closed keep-alive: retry once */
        if (c->state == HEAD && c->raw_len == 0 && c->sent == request_len && !c->retried) {
            c->retried = 1;
            drop_conn(c);
            double start = c->start;
            int index = c->index;
            reset_answer(c);
            c->retried = 1;
            c->start = start;
            c->index = index;
            if (open_conn(c) == 0) return;
        }
        fail(c, n == 0 ? "connection closed mid-answer" : strerror(errno));
        return;
    }
}

static int parse_args(int argc, char **argv, const char **body_file) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--port")) port = atoi(v);
        else if (!strcmp(k, "--host")) host = v;
        else if (!strcmp(k, "--path")) path = v;
        else if (!strcmp(k, "--body-file")) *body_file = v;
        else if (!strcmp(k, "--concurrency")) concurrency = atoi(v);
        else if (!strcmp(k, "--requests")) requests = atoi(v);
        else if (!strcmp(k, "--timeout-s")) timeout_s = atof(v);
        else if (!strcmp(k, "--spread-ms")) spread_ms = atof(v);
        else return -1;
    }
    return argc % 2 == 1 && port > 0 && *body_file && concurrency > 0 && requests >= 0 ? 0 : -1;
}

static char *read_file(const char *name, size_t *len) {
    FILE *f = fopen(name, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)size + 1);
    if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        free(data);
        return NULL;
    }
    fclose(f);
    *len = (size_t)size;
    return data;
}

int main(int argc, char **argv) {
    const char *body_file = NULL;
    if (parse_args(argc, argv, &body_file) != 0) {
        fprintf(stderr, "usage: sse_client --port P --body-file F [--host H] [--path P] "
                        "[--concurrency C] [--requests N] [--timeout-s S] [--spread-ms MS]\n");
        return 2;
    }
    size_t body_len;
    char *body = read_file(body_file, &body_len);
    if (!body) {
        perror(body_file);
        return 2;
    }
    request = malloc(body_len + 512);
    int h = snprintf(request, 512,
                     "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     "Accept: text/event-stream\r\nContent-Length: %zu\r\n\r\n",
                     path, host, port, body_len);
    memcpy(request + h, body, body_len);
    request_len = (size_t)h + body_len;
    signal(SIGPIPE, SIG_IGN);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "sse_client: bad host %s\n", host);
        return 2;
    }
    epfd = epoll_create1(0);
    if (concurrency > requests) concurrency = requests;
    Conn *conns = calloc((size_t)(concurrency > 0 ? concurrency : 1), sizeof *conns);
    origin = now_s();
    for (int i = 0; i < concurrency; i++) {
        conns[i].fd = -1;
        conns[i].times = malloc(sizeof(double) * MAX_TIMES);
        conns[i].begin_at = origin + spread_ms / 1000.0 * i / concurrency;
        conns[i].index = -1;
        conns[i].waiting = 1;
    }
    struct epoll_event events[512];
    while (finished < requests) {
        double now = now_s();
        int timeout = 100;
        for (int i = 0; i < concurrency; i++) {
            Conn *c = &conns[i];
            if (!c->waiting) continue;
            if (next_index >= requests) {
                c->waiting = 0;
                drop_conn(c);
            } else if (c->begin_at <= now) {
                c->waiting = 0;
                begin(c);
            } else {
                int ms = (int)((c->begin_at - now) * 1000) + 1;
                if (ms < timeout) timeout = ms;
            }
        }
        int n = epoll_wait(epfd, events, 512, timeout);
        for (int i = 0; i < n; i++) on_event(events[i].data.ptr, events[i].events);
        now = now_s();
        for (int i = 0; i < concurrency; i++) {
            Conn *c = &conns[i];
            if (!c->waiting && c->fd >= 0 && c->index >= 0 && now - c->start > timeout_s)
                fail(c, "timed out");
        }
    }
    fflush(stdout);
    return 0;
}
