/* A fake OpenAI-compatible stream server in C: the fleet drill's upstream.
 *
 * Why C: at 1,024 GPU-speed streams (51k chunks a second) bench/fake_upstream.py (aiohttp)
 * needs most of a core of the drill's 2-vCPU box, the core the relay under test is
 * compared on. This one writes the same bytes for the requests the drill makes (a chat
 * stream of --chunks words, --delay-ms apart, a usage chunk when asked, [DONE]) for a
 * few microseconds a chunk, so the box's cores go to the relay.
 *
 * What it answers (HTTP/1.1, keep-alive, one thread, epoll):
 *   POST /v1/chat/completions  stream or not; max_tokens / max_completion_tokens below
 *                              --chunks ends with finish_reason "length";
 *                              stream_options.include_usage adds the usage chunk
 *   GET  /v1/models, /health   for readiness probes
 * anything else: 404. The chunks are bench/fake_upstream.py's, byte for byte: the role
 * chunk at once, then each word after one delay, the usage chunk after one more, [DONE].
 * prompt_tokens is the request body's length / 4, at least 1 (the Python fake counts
 * words; nothing the drill compares reads it).
 *
 * Usage: sse_upstream --port P [--host 127.0.0.1] [--chunks 16] [--delay-ms 0]
 *                     [--model fake]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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

#define MAX_REQUEST (1 << 20)
#define MAX_EVENTS 256

static const char *WORDS[] = {"Hello", " world", ",",  " this",   " is", " a",
                              " fake", " stream", " of", " tokens", "."};
#define N_WORDS (sizeof WORDS / sizeof *WORDS)

typedef struct {
    char *data;
    size_t len, cap, sent;
} Buf;

typedef struct Conn {
    int fd;
    Buf in, out;
    int streaming;        /* an answer is being streamed */
    int tokens, sent;     /* words to send, words sent */
    int usage;            /* send the usage chunk */
    int prompt_tokens;
    int64_t due_ns;       /* when the next event is due */
    struct Conn *next;    /* in the due queue */
    int queued, closing, want_out;
} Conn;

static int chunks = 16, delay_ms = 0;
static const char *model = "fake";
static int epfd;
static Conn *queue_head, *queue_tail; /* streams by due time: every delay is the same */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void buf_add(Buf *b, const char *data, size_t len) {
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + len) cap *= 2;
        b->data = realloc(b->data, cap);
        if (!b->data) abort();
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

static void set_out_interest(Conn *c, int want) {
    if (c->want_out == want) return;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want;
}

/* Write what is pending; keep the rest (and ask for EPOLLOUT) when the socket is full. */
static void flush(Conn *c) {
    while (c->out.sent < c->out.len) {
        ssize_t n = write(c->fd, c->out.data + c->out.sent, c->out.len - c->out.sent);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            c->closing = 1;
            return;
        }
        c->out.sent += (size_t)n;
    }
    if (c->out.sent == c->out.len) c->out.len = c->out.sent = 0;
    set_out_interest(c, c->out.len != 0);
}

/* One HTTP chunk holding one SSE event: "data: <json>\n\n". */
static void add_event(Conn *c, const char *json, int len) {
    char head[32];
    int h = snprintf(head, sizeof head, "%x\r\ndata: ", len + 8);
    buf_add(&c->out, head, (size_t)h);
    buf_add(&c->out, json, (size_t)len);
    buf_add(&c->out, "\n\n\r\n", 4);
}

static void respond(Conn *c, int status, const char *type, const char *body) {
    char head[256];
    const char *reason = status == 200 ? "OK" : status == 404 ? "Not Found" : "Bad Request";
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                     status, reason, type, strlen(body));
    buf_add(&c->out, head, (size_t)h);
    buf_add(&c->out, body, strlen(body));
}

static void enqueue(Conn *c, int64_t due) {
    c->due_ns = due;
    c->next = NULL;
    c->queued = 1;
    if (queue_tail) queue_tail->next = c;
    else queue_head = c;
    queue_tail = c;
}

/* The value after the first `key` (a quoted JSON key) in the body. Good enough for the
 * drill's requests: a key's quotes cannot occur unescaped inside a string; a nested
 * object with the same key name would be misread. */
static const char *find_key(const char *body, size_t len, const char *key) {
    size_t k = strlen(key);
    const char *p = memmem(body, len, key, k);
    if (!p) return NULL;
    const char *v = p + k;
    while (v < body + len && (*v == ' ' || *v == ':')) v++;
    return v;
}

static int key_true(const char *body, size_t len, const char *key) {
    const char *v = find_key(body, len, key);
    return v && body + len - v >= 4 && memcmp(v, "true", 4) == 0;
}

static int key_int(const char *body, size_t len, const char *key, int fallback) {
    const char *v = find_key(body, len, key);
    if (!v || !isdigit((unsigned char)*v)) return fallback;
    return atoi(v);
}

static void send_word(Conn *c) {
    char json[512];
    int last = c->sent == c->tokens - 1;
    const char *finish = !last ? "null" : c->tokens == chunks ? "\"stop\"" : "\"length\"";
    int n = snprintf(json, sizeof json,
                     "{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                     "\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},"
                     "\"logprobs\":null,\"finish_reason\":%s}]}",
                     model, WORDS[c->sent % N_WORDS], finish);
    add_event(c, json, n);
    c->sent++;
}

static void send_end(Conn *c) {
    if (c->usage) {
        char json[512];
        int n = snprintf(json, sizeof json,
                         "{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                         "\"model\":\"%s\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,"
                         "\"completion_tokens\":%d,\"total_tokens\":%d}}",
                         model, c->prompt_tokens, c->tokens, c->prompt_tokens + c->tokens);
        add_event(c, json, n);
    }
    static const char done[] = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    buf_add(&c->out, done, sizeof done - 1);
    c->streaming = 0;
}

static void whole_answer(Conn *c) {
    char text[8192] = "", body[10240];
    size_t at = 0;
    for (int t = 0; t < c->tokens && at + 16 < sizeof text; t++) {
        size_t w = strlen(WORDS[t % N_WORDS]);
        memcpy(text + at, WORDS[t % N_WORDS], w);
        at += w;
    }
    text[at] = 0;
    snprintf(body, sizeof body,
             "{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion\",\"created\":0,\"model\":\"%s\","
             "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"%s\"},"
             "\"logprobs\":null,\"finish_reason\":\"%s\"}],\"usage\":{\"prompt_tokens\":%d,"
             "\"completion_tokens\":%d,\"total_tokens\":%d}}",
             model, text, c->tokens == chunks ? "stop" : "length", c->prompt_tokens, c->tokens,
             c->prompt_tokens + c->tokens);
    respond(c, 200, "application/json", body);
}

static void start_answer(Conn *c, const char *body, size_t len) {
    int max = key_int(body, len, "\"max_completion_tokens\"", -1);
    if (max < 0) max = key_int(body, len, "\"max_tokens\"", chunks);
    c->tokens = max < chunks ? max : chunks;
    c->prompt_tokens = len / 4 > 0 ? (int)(len / 4) : 1;
    c->usage = key_true(body, len, "\"include_usage\"");
    c->sent = 0;
    if (!key_true(body, len, "\"stream\"")) {
        whole_answer(c);
        return;
    }
    static const char head[] =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    buf_add(&c->out, head, sizeof head - 1);
    char json[512];
    int n = snprintf(json, sizeof json,
                     "{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                     "\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                     "\"content\":\"\"}}]}",
                     model);
    add_event(c, json, n);
    c->streaming = 1;
    enqueue(c, now_ns() + (int64_t)delay_ms * 1000000);
}

/* Parse and answer every whole request in c->in (one at a time while streaming). */
static void serve_requests(Conn *c) {
    while (!c->streaming && !c->closing) {
        char *end = memmem(c->in.data, c->in.len, "\r\n\r\n", 4);
        if (!end) {
            if (c->in.len > MAX_REQUEST) c->closing = 1;
            return;
        }
        size_t head_len = (size_t)(end - c->in.data) + 4;
        size_t body_len = 0;
        for (char *p = c->in.data; p < end; p++) {
            if ((p == c->in.data || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0)
                body_len = strtoul(p + 15, NULL, 10);
        }
        if (body_len > MAX_REQUEST) {
            c->closing = 1;
            return;
        }
        if (c->in.len < head_len + body_len) return;
        const char *body = c->in.data + head_len;
        if (strncmp(c->in.data, "POST /v1/chat/completions ", 26) == 0) {
            start_answer(c, body, body_len);
        } else if (strncmp(c->in.data, "GET /v1/models ", 15) == 0) {
            char json[256];
            snprintf(json, sizeof json,
                     "{\"object\":\"list\",\"data\":[{\"object\":\"model\",\"id\":\"%s\","
                     "\"max_model_len\":2048}]}",
                     model);
            respond(c, 200, "application/json", json);
        } else if (strncmp(c->in.data, "GET /health ", 12) == 0) {
            respond(c, 200, "application/json", "{}");
        } else {
            respond(c, 404, "application/json", "{\"error\":{\"message\":\"not found\"}}");
        }
        memmove(c->in.data, c->in.data + head_len + body_len, c->in.len - head_len - body_len);
        c->in.len -= head_len + body_len;
    }
}

static void close_conn(Conn *c) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1; /* freed once out of the due queue */
    if (!c->queued) {
        free(c->in.data);
        free(c->out.data);
        free(c);
    }
}

static void on_readable(Conn *c) {
    char chunk[65536];
    for (;;) {
        ssize_t n = read(c->fd, chunk, sizeof chunk);
        if (n > 0) {
            buf_add(&c->in, chunk, (size_t)n);
            if ((size_t)n < sizeof chunk) break;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        c->closing = 1; /* EOF or error: the client left */
        return;
    }
    serve_requests(c);
}

/* Send every event that is due; a stream's next one is due one delay after this one. */
static void send_due(void) {
    int64_t now = now_ns();
    while (queue_head && queue_head->due_ns <= now) {
        Conn *c = queue_head;
        queue_head = c->next;
        if (!queue_head) queue_tail = NULL;
        c->queued = 0;
        if (c->fd < 0) {
            free(c->in.data);
            free(c->out.data);
            free(c);
            continue;
        }
        if (c->sent < c->tokens) {
            send_word(c);
            enqueue(c, now + (int64_t)delay_ms * 1000000);
        } else {
            send_end(c);
            serve_requests(c); /* a request pipelined behind this answer */
        }
        flush(c);
        if (c->closing) close_conn(c);
    }
}

static int parse_args(int argc, char **argv, const char **host, int *port) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port")) *port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--host")) *host = argv[i + 1];
        else if (!strcmp(argv[i], "--chunks")) chunks = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--delay-ms")) delay_ms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else return -1;
    }
    return (argc % 2 == 1 && *port > 0 && chunks > 0 && delay_ms >= 0) ? 0 : -1;
}

int main(int argc, char **argv) {
    const char *host = "127.0.0.1";
    int port = 0;
    if (parse_args(argc, argv, &host, &port) != 0) {
        fprintf(stderr,
                "usage: sse_upstream --port P [--host H] [--chunks N] [--delay-ms D] [--model M]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1 ||
        bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(lfd, 4096) != 0) {
        perror("sse_upstream: listen");
        return 1;
    }
    epfd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev);
    fprintf(stderr, "sse_upstream: %s:%d, %d chunks %d ms apart\n", host, port, chunks, delay_ms);
    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int timeout = -1;
        if (queue_head) {
            int64_t wait = queue_head->due_ns - now_ns();
            timeout = wait <= 0 ? 0 : (int)((wait + 999999) / 1000000);
        }
        int n = epoll_wait(epfd, events, MAX_EVENTS, timeout);
        for (int i = 0; i < n; i++) {
            Conn *c = events[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    Conn *nc = calloc(1, sizeof *nc);
                    nc->fd = fd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            if (c->fd < 0) continue;
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
            if (!c->closing) flush(c);
            if (c->closing) close_conn(c);
        }
        send_due();
    }
}
