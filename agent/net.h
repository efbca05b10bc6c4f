/* net: `gpusync-agent net`, the network probes a multi-node run needs from its servers: which
 * local address this server reaches another by (the client picks MASTER_ADDR with it), and
 * whether one server can open a TCP connection to another (doctor's check that node 1 reaches
 * MASTER_ADDR). No packet is sent to find the address: a UDP socket's connect only asks the
 * kernel's routing table. */
#ifndef GA_NET_H
#define GA_NET_H

/* `gpusync-agent net src ADDR | listen [--timeout-ms MS] | connect ADDR PORT [--timeout-ms MS]`
 * (argv[0] = "net"; a leading "--root DIR", which every client command has, is ignored), as
 * GS_PROTO_NET_* in proto/run.h describes. Returns 0, 1 on failure (the
 * reason on stderr) or 2 for bad usage. */
int ga_net_main(int argc, char **argv);

#endif
