// frame_pingpong: the ceiling of the raw frame path between two hosts (or two
// network namespaces on a veth pair) for AoE-shaped traffic at MTU 1500.
//
// The "blast" side keeps a window of 1060-byte frames in flight (the size of an
// AoE write of two sectors: Ethernet 14 + AoE 10 + ATA 12 + 1024 data bytes), and
// the "reflect" side answers each with a 60-byte frame (an AoE write's answer,
// padded to the Ethernet minimum). Nothing else happens: no protocol, no storage.
// So the answers per second it reaches bound what any AoE target and initiator
// can do through the same kernel interface on the same machine.
//
// Kernel interfaces, the same on both sides:
//   packet        AF_PACKET: a TPACKET_V2 receive ring and sendmmsg(2), which is
//                 what blockwire's AoE data path uses;
//   xdp           AF_XDP in copy mode, XDP program in the driver (veth supports it);
//   xdp-generic   AF_XDP in copy mode, XDP program in the generic (skb) hook.
// The XDP modes use libxdp's default program, which redirects every frame of the
// interface's queue 0 to the socket: run them only on an interface of their own.
//
// usage: frame_pingpong reflect MODE IFACE
//        frame_pingpong blast MODE IFACE [SECONDS [WINDOW]]
// blast prints one line: answers/s, MB/s (1 KiB of payload per answer), stalls.
// reflect prints "ready" once it listens, and runs until SIGINT or SIGTERM; then it
// detaches what it attached.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/if_packet.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <bpf/libbpf.h>
#include <xdp/xsk.h>

#define ETHERTYPE 0x88B5 /* IEEE 802 local experimental: nobody else listens */
#define REQUEST_BYTES 1060
#define ANSWER_BYTES 60
#define PAYLOAD_BYTES 1024
#define BATCH 64
#define TAG_OFFSET 14

static void die(const char *what) {
  perror(what);
  exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static volatile sig_atomic_t stopping;
static void on_signal(int sig) {
  (void)sig;
  stopping = 1;
}

/* One kernel interface: receive a batch, and queue then send frames. */
struct port {
  /* Calls `each` for up to BATCH received frames; waits up to 1 ms for the first. */
  int (*receive)(void (*each)(const unsigned char *, unsigned));
  /* A buffer for the next outgoing frame, then `queue` it with its length. */
  unsigned char *(*next_buffer)(void);
  void (*queue)(unsigned len);
  void (*send)(void);
  void (*close)(void);
};

/* ---- AF_PACKET: TPACKET_V2 receive ring, sendmmsg ---- */

#define RING_BLOCK (64u << 10)
#define RING_BLOCKS 64u
#define RING_SLOT 2048u

static int packet_fd, packet_ifindex;
static unsigned char *packet_ring;
static unsigned packet_slots, packet_next;
static unsigned char packet_out[BATCH][REQUEST_BYTES];
static struct iovec packet_iov[BATCH];
static struct mmsghdr packet_msgs[BATCH];
static int packet_queued;

static struct tpacket2_hdr *packet_slot(unsigned i) {
  return (struct tpacket2_hdr *)(packet_ring + (size_t)i * RING_SLOT);
}

static int packet_ready(struct tpacket2_hdr *h) {
  return __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER;
}

static int packet_receive(void (*each)(const unsigned char *, unsigned)) {
  int n = 0;
  while (n < BATCH) {
    struct tpacket2_hdr *h = packet_slot(packet_next);
    if (!packet_ready(h)) {
      if (n)
        break;
      struct pollfd p = {packet_fd, POLLIN, 0};
      poll(&p, 1, 1);
      if (!packet_ready(h))
        break;
    }
    each((const unsigned char *)h + h->tp_mac, h->tp_snaplen);
    __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
    packet_next = (packet_next + 1) % packet_slots;
    n++;
  }
  return n;
}

static unsigned char *packet_next_buffer(void) { return packet_out[packet_queued]; }

static void packet_queue(unsigned len) {
  packet_iov[packet_queued] = (struct iovec){packet_out[packet_queued], len};
  packet_queued++;
}

static void packet_send(void) {
  static struct sockaddr_ll to;
  to.sll_family = AF_PACKET;
  to.sll_ifindex = packet_ifindex;
  to.sll_halen = ETH_ALEN;
  for (int i = 0; i < packet_queued; i++)
    packet_msgs[i].msg_hdr = (struct msghdr){
        .msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &packet_iov[i], .msg_iovlen = 1};
  int done = 0;
  while (done < packet_queued) {
    int sent = sendmmsg(packet_fd, packet_msgs + done, packet_queued - done, 0);
    if (sent < 0) {
      if (errno == ENOBUFS || errno == EAGAIN || errno == EINTR)
        continue;
      die("sendmmsg");
    }
    done += sent;
  }
  packet_queued = 0;
}

static void packet_close(void) { close(packet_fd); }

static struct port packet_open(const char *ifname) {
  packet_fd = socket(AF_PACKET, SOCK_RAW, htons(ETHERTYPE));
  if (packet_fd < 0)
    die("socket(AF_PACKET)");
  int version = TPACKET_V2;
  if (setsockopt(packet_fd, SOL_PACKET, PACKET_VERSION, &version, sizeof version))
    die("PACKET_VERSION");
  struct tpacket_req req = {RING_BLOCK, RING_BLOCKS, RING_SLOT,
                            RING_BLOCKS * (RING_BLOCK / RING_SLOT)};
  if (setsockopt(packet_fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req))
    die("PACKET_RX_RING");
  packet_slots = req.tp_frame_nr;
  packet_ring = mmap(NULL, (size_t)RING_BLOCK * RING_BLOCKS, PROT_READ | PROT_WRITE,
                     MAP_SHARED, packet_fd, 0);
  if (packet_ring == MAP_FAILED)
    die("mmap ring");
  int bytes = 8 << 20;
  setsockopt(packet_fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes);
  packet_ifindex = if_nametoindex(ifname);
  if (!packet_ifindex)
    die(ifname);
  struct sockaddr_ll at = {.sll_family = AF_PACKET, .sll_protocol = htons(ETHERTYPE),
                           .sll_ifindex = packet_ifindex};
  if (bind(packet_fd, (struct sockaddr *)&at, sizeof at))
    die("bind");
  return (struct port){packet_receive, packet_next_buffer, packet_queue, packet_send,
                       packet_close};
}

/* ---- AF_XDP in copy mode, through libxdp ---- */

#define UMEM_FRAMES 4096u
#define UMEM_FRAME 2048u
#define RING_SIZE 2048u /* half the frames wait in the fill ring, half are for sending */

static struct xsk_umem *umem;
static struct xsk_socket *xsk;
static struct xsk_ring_prod fill_ring, tx_ring;
static struct xsk_ring_cons completion_ring, rx_ring;
static unsigned char *umem_area;
static uint64_t free_frames[UMEM_FRAMES];
static unsigned free_count;
static int xdp_ifindex;
static unsigned xdp_flags;
static uint64_t tx_addr[BATCH];
static unsigned tx_len[BATCH];
static int tx_queued;

static void xdp_kick(void) { sendto(xsk_socket__fd(xsk), NULL, 0, MSG_DONTWAIT, NULL, 0); }

static void xdp_reap_completions(void) {
  uint32_t at;
  unsigned n = xsk_ring_cons__peek(&completion_ring, UMEM_FRAMES, &at);
  for (unsigned i = 0; i < n; i++)
    free_frames[free_count++] = *xsk_ring_cons__comp_addr(&completion_ring, at + i);
  if (n)
    xsk_ring_cons__release(&completion_ring, n);
}

static int xdp_receive(void (*each)(const unsigned char *, unsigned)) {
  uint32_t at, fill_at;
  unsigned n = xsk_ring_cons__peek(&rx_ring, BATCH, &at);
  if (!n) {
    struct pollfd p = {xsk_socket__fd(xsk), POLLIN, 0};
    poll(&p, 1, 1);
    n = xsk_ring_cons__peek(&rx_ring, BATCH, &at);
    if (!n)
      return 0;
  }
  /* Every received frame goes straight back to the fill ring: it has room, as it
     held these frames before the kernel filled them. */
  while (xsk_ring_prod__reserve(&fill_ring, n, &fill_at) != n)
    ;
  for (unsigned i = 0; i < n; i++) {
    const struct xdp_desc *d = xsk_ring_cons__rx_desc(&rx_ring, at + i);
    each(xsk_umem__get_data(umem_area, d->addr), d->len);
    *xsk_ring_prod__fill_addr(&fill_ring, fill_at + i) = d->addr;
  }
  xsk_ring_cons__release(&rx_ring, n);
  xsk_ring_prod__submit(&fill_ring, n);
  return n;
}

static unsigned char *xdp_next_buffer(void) {
  while (free_count == 0) {
    xdp_kick();
    xdp_reap_completions();
  }
  return xsk_umem__get_data(umem_area, free_frames[free_count - 1]);
}

static void xdp_queue(unsigned len) {
  tx_addr[tx_queued] = free_frames[--free_count];
  tx_len[tx_queued] = len;
  tx_queued++;
}

static void xdp_send(void) {
  uint32_t at = 0;
  while (xsk_ring_prod__reserve(&tx_ring, tx_queued, &at) != (unsigned)tx_queued) {
    xdp_kick();
    xdp_reap_completions();
  }
  for (int i = 0; i < tx_queued; i++) {
    struct xdp_desc *d = xsk_ring_prod__tx_desc(&tx_ring, at + i);
    d->addr = tx_addr[i];
    d->len = tx_len[i];
    d->options = 0;
  }
  xsk_ring_prod__submit(&tx_ring, tx_queued);
  tx_queued = 0;
  /* Copy mode sends only inside this system call, a budget of frames per call. */
  while (sendto(xsk_socket__fd(xsk), NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 &&
         (errno == EAGAIN || errno == EBUSY || errno == ENOBUFS || errno == EINTR))
    xdp_reap_completions();
  xdp_reap_completions();
}

static void xdp_close(void) {
  xsk_socket__delete(xsk);
  xsk_umem__delete(umem);
  /* libxdp leaves its program attached; the next mode needs the hook free. */
  bpf_xdp_detach(xdp_ifindex, xdp_flags, NULL);
}

static struct port xdp_open(const char *ifname, int generic) {
  umem_area = mmap(NULL, (size_t)UMEM_FRAMES * UMEM_FRAME, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (umem_area == MAP_FAILED)
    die("mmap umem");
  struct xsk_umem_config ucfg = {.fill_size = RING_SIZE, .comp_size = RING_SIZE,
                                 .frame_size = UMEM_FRAME, .frame_headroom = 0};
  int err = xsk_umem__create(&umem, umem_area, (size_t)UMEM_FRAMES * UMEM_FRAME, &fill_ring,
                             &completion_ring, &ucfg);
  if (err) {
    errno = -err;
    die("xsk_umem__create");
  }
  xdp_ifindex = if_nametoindex(ifname);
  if (!xdp_ifindex)
    die(ifname);
  xdp_flags = generic ? XDP_FLAGS_SKB_MODE : XDP_FLAGS_DRV_MODE;
  struct xsk_socket_config scfg = {
      .rx_size = RING_SIZE, .tx_size = RING_SIZE, .xdp_flags = xdp_flags,
      .bind_flags = XDP_COPY};
  /* The kernel releases a closed socket's hold on the queue a little later: a run
     right after another may find the queue still taken for a moment. */
  for (int tries = 0;; tries++) {
    err = xsk_socket__create(&xsk, ifname, 0, umem, &rx_ring, &tx_ring, &scfg);
    if (err != -EBUSY || tries == 50)
      break;
    usleep(100 * 1000);
  }
  if (err) {
    errno = -err;
    die("xsk_socket__create");
  }
  uint32_t at = 0;
  xsk_ring_prod__reserve(&fill_ring, RING_SIZE, &at);
  for (unsigned i = 0; i < RING_SIZE; i++)
    *xsk_ring_prod__fill_addr(&fill_ring, at + i) = (uint64_t)i * UMEM_FRAME;
  xsk_ring_prod__submit(&fill_ring, RING_SIZE);
  for (unsigned i = RING_SIZE; i < UMEM_FRAMES; i++)
    free_frames[free_count++] = (uint64_t)i * UMEM_FRAME;
  return (struct port){xdp_receive, xdp_next_buffer, xdp_queue, xdp_send, xdp_close};
}

/* ---- the two roles ---- */

static struct port port;
static long answers;
static uint32_t next_tag;
static unsigned char request_template[REQUEST_BYTES], answer_template[ANSWER_BYTES];

static void count_answer(const unsigned char *frame, unsigned len) {
  (void)frame;
  if (len >= TAG_OFFSET + 4)
    answers++;
}

static void answer(const unsigned char *frame, unsigned len) {
  if (len < TAG_OFFSET + 4)
    return;
  unsigned char *out = port.next_buffer();
  memcpy(out, answer_template, ANSWER_BYTES);
  memcpy(out, frame + ETH_ALEN, ETH_ALEN); /* back to the sender */
  memcpy(out + TAG_OFFSET, frame + TAG_OFFSET, 4);
  port.queue(ANSWER_BYTES);
}

static void send_requests(long count) {
  for (long i = 0; i < count; i++) {
    unsigned char *out = port.next_buffer();
    memcpy(out, request_template, REQUEST_BYTES);
    memcpy(out + TAG_OFFSET, &next_tag, 4);
    next_tag++;
    port.queue(REQUEST_BYTES);
    if ((i + 1) % BATCH == 0)
      port.send();
  }
  port.send();
}

int main(int argc, char **argv) {
  if (argc < 4 || (strcmp(argv[1], "reflect") && strcmp(argv[1], "blast"))) {
    fprintf(stderr, "usage: frame_pingpong reflect|blast packet|xdp|xdp-generic IFACE "
                    "[SECONDS [WINDOW]]\n");
    return 2;
  }
  const char *mode = argv[2], *ifname = argv[3];
  if (!strcmp(mode, "packet"))
    port = packet_open(ifname);
  else if (!strcmp(mode, "xdp") || !strcmp(mode, "xdp-generic"))
    port = xdp_open(ifname, !strcmp(mode, "xdp-generic"));
  else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  memset(request_template, 0, sizeof request_template);
  memset(request_template, 0xff, ETH_ALEN); /* broadcast: the reflector learns our MAC */
  request_template[12] = ETHERTYPE >> 8;
  request_template[13] = ETHERTYPE & 0xff;
  memset(answer_template, 0, sizeof answer_template);
  answer_template[12] = ETHERTYPE >> 8;
  answer_template[13] = ETHERTYPE & 0xff;
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  if (!strcmp(argv[1], "reflect")) {
    printf("ready\n");
    fflush(stdout);
    while (!stopping)
      if (port.receive(answer))
        port.send();
    port.close();
    return 0;
  }

  double seconds = argc > 4 ? atof(argv[4]) : 5;
  long window = argc > 5 ? atol(argv[5]) : 256;
  double start = now(), end = start + seconds, last_answer = start;
  long sent = 0, stalls = 0;
  send_requests(window);
  sent += window;
  while (!stopping && now() < end) {
    long before = answers;
    port.receive(count_answer);
    long got = answers - before;
    if (got) {
      last_answer = now();
      send_requests(got);
      sent += got;
    } else if (now() - last_answer > 0.05) {
      /* Frames were lost (a full ring): refill the window and count the stall. */
      long missing = sent - answers;
      if (missing > window)
        missing = window;
      send_requests(missing);
      sent += missing;
      stalls++;
      last_answer = now();
    }
  }
  double elapsed = now() - start;
  printf("%s answers/s %.0f MB/s %.1f stalls %ld\n", mode, answers / elapsed,
         answers * (double)PAYLOAD_BYTES / elapsed / 1e6, stalls);
  port.close();
  return 0;
}
