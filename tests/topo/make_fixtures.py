#!/usr/bin/env python3
"""make_fixtures.py — writes tests/topo/<case>/topology.xml: hwloc 2.x XML
topologies of GPU nodes, modelled on real machines, for common/place/topo.c and the
placement golden tests. Python 3 standard library only; the output is
deterministic. Regenerate with `python3 tests/topo/make_fixtures.py`.

The XML is what hwloc 2.x itself exports (`lstopo --of xml`), including what
its NVML backend adds: an `NVLinkBandwidth` distances matrix (MB/s, 25000 per
NVLink 2-4 link, summed over the links between two endpoints) between the
`nvmlN` OS devices and, on NVSwitch systems, the NVSwitch PCI devices. Matrices
whose objects are not all of one type are written as `<distances2hetero>` with
`Type:gp_index` indexes; homogeneous matrices of I/O objects as `<distances2
type=... indexing="gp">`. Every `length` attribute is the exact character count
of the element's text (hwloc rejects the file otherwise).
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))

# hwloc 2.x OS device types (hwloc_obj_osdev_type_e)
OSDEV_BLOCK, OSDEV_GPU, OSDEV_NETWORK, OSDEV_OPENFABRICS, OSDEV_DMA, OSDEV_COPROC = range(6)

# hwloc_distances_kind_e
KIND_FROM_OS, KIND_MEANS_LATENCY, KIND_MEANS_BANDWIDTH, KIND_HETEROGENEOUS = 1, 4, 8, 16

NVLINK_MBPS = 25000  # what hwloc's NVML backend counts per NVLink 2.0-4.0 link

GEN3_X16, GEN4_X16, GEN5_X16 = "15.753846", "31.507692", "63.015385"  # GB/s, as hwloc writes them


def bitmap(bits):
    """An hwloc bitmap string: 32-bit words, most significant first."""
    value = 0
    for b in bits:
        value |= 1 << b
    words = []
    while True:
        words.append(value & 0xFFFFFFFF)
        value >>= 32
        if not value:
            break
    words.reverse()
    # as hwloc_bitmap_snprintf: the first word padded, inner zero words empty, a zero last
    # word "0x0"
    out = ["0x%08x" % words[0]]
    for k, w in enumerate(words[1:], 1):
        out.append("0x%08x" % w if w else ("0x0" if k == len(words) - 1 else ""))
    return ",".join(out)


def esc(s):
    return (str(s).replace("&", "&amp;").replace('"', "&quot;")
            .replace("<", "&lt;").replace(">", "&gt;"))


class Obj:
    def __init__(self, topo, type_, attrs=(), infos=()):
        self.type = type_
        self.gp = topo.new_gp()
        self.attrs = list(attrs)
        self.infos = list(infos)
        self.children = []

    def add(self, child):
        self.children.append(child)
        return child

    def write(self, out, indent):
        pad = "  " * indent
        attrs = [("type", self.type)]
        pre = [a for a in self.attrs if a[0] in ("os_index", "cpuset", "complete_cpuset",
                                                  "allowed_cpuset", "nodeset", "complete_nodeset",
                                                  "allowed_nodeset")]
        post = [a for a in self.attrs if a not in pre]
        attrs += pre + [("gp_index", self.gp)] + post
        head = pad + "<object " + " ".join('%s="%s"' % (k, esc(v)) for k, v in attrs)
        if not self.infos and not self.children:
            out.append(head + "/>")
            return
        out.append(head + ">")
        for name, value in self.infos:
            out.append('%s  <info name="%s" value="%s"/>' % (pad, esc(name), esc(value)))
        for c in self.children:
            c.write(out, indent + 1)
        out.append(pad + "</object>")


class Topology:
    def __init__(self):
        self.gp = 0
        self.root = None
        self.distances = []  # (xml text lines)

    def new_gp(self):
        self.gp += 1
        return self.gp

    def write(self, path):
        out = ['<?xml version="1.0" encoding="UTF-8"?>',
               '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
               '<topology version="2.0">']
        self.root.write(out, 1)
        out += self.distances
        out.append("</topology>")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("\n".join(out) + "\n")


def chunked(tag, items, per_line=10):
    """hwloc writes index and value arrays ten to an element, with exact lengths."""
    lines = []
    for i in range(0, len(items), per_line):
        text = "".join("%s " % x for x in items[i:i + per_line])
        lines.append('    <%s length="%d">%s</%s>' % (tag, len(text), text, tag))
    return lines


def add_numa_latency(topo, n_numa):
    if n_numa < 2:
        return
    values = [10 if i == j else 21 for i in range(n_numa) for j in range(n_numa)]
    topo.distances.append('  <distances2 type="NUMANode" nbobjs="%d" kind="%d" name="NUMALatency" '
                          'indexing="os">' % (n_numa, KIND_FROM_OS | KIND_MEANS_LATENCY))
    topo.distances += chunked("indexes", list(range(n_numa)))
    topo.distances += chunked("u64values", values)
    topo.distances.append("  </distances2>")


def add_nvlink_bandwidth(topo, objs, bw):
    """objs: the matrix objects (Obj), bw: {(i, j): MB/s}, symmetric, diagonal included."""
    n = len(objs)
    values = [bw.get((i, j), bw.get((j, i), 0)) for i in range(n) for j in range(n)]
    kind = KIND_FROM_OS | KIND_MEANS_BANDWIDTH
    types = {o.type for o in objs}
    if len(types) > 1:
        topo.distances.append('  <distances2hetero nbobjs="%d" kind="%d" name="NVLinkBandwidth">'
                              % (n, kind | KIND_HETEROGENEOUS))
        topo.distances += chunked("indexes", ["%s:%d" % (o.type, o.gp) for o in objs])
        topo.distances += chunked("u64values", values)
        topo.distances.append("  </distances2hetero>")
    else:
        topo.distances.append('  <distances2 type="%s" nbobjs="%d" kind="%d" name="NVLinkBandwidth" '
                              'indexing="gp">' % (types.pop(), n, kind))
        topo.distances += chunked("indexes", [o.gp for o in objs])
        topo.distances += chunked("u64values", values)
        topo.distances.append("  </distances2>")


# ---- the CPU side --------------------------------------------------------------------------

class Cpu:
    """packages × cores × threads; core c (global) has PUs c, c + total_cores, ... as Linux
    numbers them on x86 servers. ccx_cores: cores per L3 (AMD CCD), else one L3 per package."""

    def __init__(self, model, vendor, packages, cores, threads, l3_bytes, l2_bytes, l1_bytes,
                 numa_bytes, ccx_cores=None):
        self.model, self.vendor = model, vendor
        self.packages, self.cores, self.threads = packages, cores, threads
        self.l3_bytes, self.l2_bytes, self.l1_bytes = l3_bytes, l2_bytes, l1_bytes
        self.numa_bytes = numa_bytes
        self.ccx_cores = ccx_cores or cores

    def pus_of_core(self, package, core):
        total = self.packages * self.cores
        g = package * self.cores + core
        return [g + t * total for t in range(self.threads)]

    def pus_of_package(self, package):
        return sorted(pu for c in range(self.cores) for pu in self.pus_of_core(package, c))


def sets(pus, nodes):
    return [("cpuset", bitmap(pus)), ("complete_cpuset", bitmap(pus)),
            ("nodeset", bitmap(nodes)), ("complete_nodeset", bitmap(nodes))]


def machine(topo, cpu, hostname, product):
    all_pus = sorted(pu for p in range(cpu.packages) for pu in cpu.pus_of_package(p))
    nodes = list(range(cpu.packages))
    root = Obj(topo, "Machine",
               [("os_index", 0), ("cpuset", bitmap(all_pus)), ("complete_cpuset", bitmap(all_pus)),
                ("allowed_cpuset", bitmap(all_pus)), ("nodeset", bitmap(nodes)),
                ("complete_nodeset", bitmap(nodes)), ("allowed_nodeset", bitmap(nodes))],
               [("DMIProductName", product), ("Backend", "Linux"), ("OSName", "Linux"),
                ("OSRelease", "5.15.0-105-generic"), ("HostName", hostname),
                ("Architecture", "x86_64"), ("hwlocVersion", "2.9.0")])
    topo.root = root
    packages = []
    for p in range(cpu.packages):
        ppus = cpu.pus_of_package(p)
        pkg = root.add(Obj(topo, "Package", [("os_index", p)] + sets(ppus, [p]),
                           [("CPUVendor", cpu.vendor), ("CPUModel", cpu.model)]))
        pkg.add(Obj(topo, "NUMANode", [("os_index", p)] + sets(ppus, [p]) +
                    [("local_memory", cpu.numa_bytes)]))
        for first in range(0, cpu.cores, cpu.ccx_cores):
            l3_index = (p * cpu.cores + first) // cpu.ccx_cores
            group = range(first, first + cpu.ccx_cores)
            l3pus = sorted(pu for c in group for pu in cpu.pus_of_core(p, c))
            l3 = pkg.add(Obj(topo, "L3Cache", [("os_index", l3_index)] + sets(l3pus, [p]) +
                             [("cache_size", cpu.l3_bytes), ("depth", 3), ("cache_linesize", 64),
                              ("cache_associativity", 15), ("cache_type", 0)]))
            for c in group:
                pus = cpu.pus_of_core(p, c)
                g = p * cpu.cores + c
                l2 = l3.add(Obj(topo, "L2Cache", [("os_index", g)] + sets(pus, [p]) +
                                [("cache_size", cpu.l2_bytes), ("depth", 2),
                                 ("cache_linesize", 64), ("cache_associativity", 16),
                                 ("cache_type", 0)]))
                l1 = l2.add(Obj(topo, "L1Cache", [("os_index", g)] + sets(pus, [p]) +
                                [("cache_size", cpu.l1_bytes), ("depth", 1),
                                 ("cache_linesize", 64), ("cache_associativity", 12),
                                 ("cache_type", 1)]))
                # Linux core ids restart in each package
                core = l1.add(Obj(topo, "Core", [("os_index", c)] + sets(pus, [p])))
                for pu in pus:
                    core.add(Obj(topo, "PU", [("os_index", pu)] + sets([pu], [p])))
        packages.append(pkg)
    add_numa_latency(topo, cpu.packages)
    return packages


# ---- the PCI side ---------------------------------------------------------------------------
#
# A PCI tree is described with Dev / Switch / Port and numbered the way firmware does it:
# depth first, each bridge's secondary bus is the next free bus number.

class Dev:
    """A PCI device (function 0, plus `functions` more on the same bus/device)."""

    def __init__(self, klass, ids, sub, rev, speed, vendor_name, device_name, osdevs=(),
                 subtype=None, functions=(), tag=None):
        self.klass, self.ids, self.sub, self.rev, self.speed = klass, ids, sub, rev, speed
        self.vendor_name, self.device_name = vendor_name, device_name
        self.osdevs, self.subtype, self.functions, self.tag = list(osdevs), subtype, functions, tag


class Switch:
    """A PCIe switch: its upstream port, and downstream ports (devfn, child)."""

    def __init__(self, ids, rev, speed, vendor_name, ports):
        self.ids, self.rev, self.speed, self.vendor_name, self.ports = ids, rev, speed, vendor_name, ports


class OsDev:
    def __init__(self, name, osdev_type, subtype=None, infos=(), tag=None):
        self.name, self.osdev_type, self.subtype, self.infos, self.tag = (
            name, osdev_type, subtype, list(infos), tag)


class PciBuilder:
    def __init__(self, topo):
        self.topo = topo
        self.tagged = {}  # tag -> Obj, for the distance matrices and for the tests' comments

    def host_bridge(self, parent, base_bus, root_ports, root_port_ids=("8086:352a", "8086:0000"),
                    root_port_rev="04"):
        """root_ports: [(devfn, child, link_speed)] on bus base_bus."""
        hb = parent.add(Obj(self.topo, "Bridge", [("bridge_type", "0-1"), ("depth", 0)]))
        self.next_bus = base_bus + 1
        vendor = {"8086": "Intel Corporation", "1022": "Advanced Micro Devices, Inc. [AMD]"}[
            root_port_ids[0][:4]]
        for devfn, child, speed in root_ports:
            self.bridge(hb, base_bus, devfn, root_port_ids, root_port_rev, speed, vendor, child, 1)
        hb.attrs.append(("bridge_pci", "0000:[%02x-%02x]" % (base_bus, self.next_bus - 1)))
        return hb

    def bridge(self, parent, bus, devfn, ids, rev, speed, vendor_name, child, depth):
        secondary = self.next_bus
        self.next_bus += 1
        br = parent.add(Obj(self.topo, "Bridge", [("bridge_type", "1-1"), ("depth", depth)],
                            [("PCIVendor", vendor_name)]))
        self.child(br, secondary, child, depth + 1)
        br.attrs += [("bridge_pci", "0000:[%02x-%02x]" % (secondary, self.next_bus - 1)),
                     ("pci_busid", "0000:%02x:%s" % (bus, devfn)),
                     ("pci_type", "0604 [%s] [%s] %s" % (ids[0], ids[1], rev)),
                     ("pci_link_speed", speed)]
        return br

    def child(self, parent, bus, child, depth):
        if isinstance(child, Switch):
            self._switch(parent, bus, child, depth)
        else:
            self.device(parent, bus, "00.0", child)
            for fn, extra in child.functions:
                self.device(parent, bus, fn, extra)

    def _switch(self, parent, bus, sw, depth):
        secondary = self.next_bus
        self.next_bus += 1
        up = parent.add(Obj(self.topo, "Bridge", [("bridge_type", "1-1"), ("depth", depth)],
                            [("PCIVendor", sw.vendor_name)]))
        for devfn, child in sw.ports:
            self.bridge(up, secondary, devfn, sw.ids, sw.rev, sw.speed, sw.vendor_name, child,
                        depth + 1)
        up.attrs += [("bridge_pci", "0000:[%02x-%02x]" % (secondary, self.next_bus - 1)),
                     ("pci_busid", "0000:%02x:00.0" % bus),
                     ("pci_type", "0604 [%s] [%s] %s" % (sw.ids[0], sw.ids[1], sw.rev)),
                     ("pci_link_speed", sw.speed)]

    def device(self, parent, bus, devfn, dev):
        attrs = []
        if dev.subtype:
            attrs.append(("subtype", dev.subtype))
        attrs += [("pci_busid", "0000:%02x:%s" % (bus, devfn)),
                  ("pci_type", "%s [%s] [%s] %s" % (dev.klass, dev.ids, dev.sub, dev.rev)),
                  ("pci_link_speed", dev.speed)]
        names = [("PCIVendor", dev.vendor_name), ("PCIDevice", dev.device_name)]
        obj = parent.add(Obj(self.topo, "PCIDev", attrs, [n for n in names if n[1] is not None]))
        if dev.tag:
            self.tagged[dev.tag] = obj
        for od in dev.osdevs:
            oattrs = ([("subtype", od.subtype)] if od.subtype else []) + [
                ("name", od.name), ("osdev_type", od.osdev_type)]
            o = obj.add(Obj(self.topo, "OSDev", oattrs, od.infos))
            if od.tag:
                self.tagged[od.tag] = o
        return obj


# ---- devices ------------------------------------------------------------------------------

def cuda_osdev(index, model, mem_mib, l2_kib, sms, shmem_kib):
    return OsDev("cuda%d" % index, OSDEV_COPROC, "CUDA",
                 [("Backend", "CUDA"), ("GPUVendor", "NVIDIA Corporation"), ("GPUModel", model),
                  ("CUDAGlobalMemorySize", mem_mib * 1024), ("CUDAL2CacheSize", l2_kib),
                  ("CUDAMultiProcessors", sms), ("CUDACoresPerMP", 128 if sms > 100 else 64),
                  ("CUDASharedMemorySizePerMP", shmem_kib)])


def nvml_osdev(index, model, uuid):
    return OsDev("nvml%d" % index, OSDEV_GPU, "NVML",
                 [("Backend", "NVML"), ("GPUVendor", "NVIDIA Corporation"), ("GPUModel", model),
                  ("NVIDIAUUID", uuid)], tag="nvml%d" % index)


def uuid(n):
    return "GPU-%08x-%04x-%04x-%04x-%012x" % (0x5e1f0000 + n * 7919, n, 0x4000 + n, 0x8000 + n,
                                              0x1c0ffee00000 + n)


def openfabrics(name, port_state=4, lid=None, gids=(), link_layer=None, guid=0):
    infos = [("NodeGUID", "%04x:%04x:%04x:%04x" % (0xb83f, 0xd203, guid >> 16 & 0xffff, guid & 0xffff)),
             ("SysImageGUID", "%04x:%04x:%04x:%04x" % (0xb83f, 0xd203, guid >> 16 & 0xffff,
                                                       guid & 0xffff)),
             ("Port1State", port_state)]
    if link_layer:
        infos.append(("Port1LinkLayer", link_layer))
    if lid is not None:
        infos += [("Port1LID", "0x%x" % lid), ("Port1LMC", 0)]
    for i, gid in enumerate(gids):
        infos.append(("Port1GID%d" % i, gid))
    return OsDev(name, OSDEV_OPENFABRICS, None, infos)


def ib_gid(guid):
    return "fe80:0000:0000:0000:b83f:d203:%04x:%04x" % (guid >> 16 & 0xffff, guid & 0xffff)


def ipoib_address(guid):
    """An IPoIB hardware address: 20 bytes (QPN + GID)."""
    raw = "00:00:10:49:fe:80:00:00:00:00:00:00:b8:3f:d2:03:%02x:%02x:%02x:%02x" % (
        guid >> 24 & 0xff, guid >> 16 & 0xff, guid >> 8 & 0xff, guid & 0xff)
    return raw


def netdev(name, address, port=None):
    infos = [("Address", address)]
    if port is not None:
        infos.append(("Port", port))
    return OsDev(name, OSDEV_NETWORK, None, infos)


def ib_hca(index, ids, sub, device_name, speed, netdev_name):
    guid = 0x00a10000 + index * 0x100
    return Dev("0207", ids, sub, "00", speed, "Mellanox Technologies", device_name,
               [netdev(netdev_name, ipoib_address(guid), 1),
                openfabrics("mlx5_%d" % index, lid=0x10 + index, gids=[ib_gid(guid)], guid=guid)],
               tag="mlx5_%d" % index)


# ---- 1. h100_sxm8 ---------------------------------------------------------------------------

def x710_eno1(mac):
    """Management Ethernet: an Intel X710 port named eno1."""
    return Dev("0200", "8086:1572", "8086:0007", "02", GEN3_X16, "Intel Corporation",
               "Ethernet Controller X710 for 10GbE SFP+", [netdev("eno1", mac)], tag="eno1")


def h100_sxm8():
    """An HGX H100 8-GPU node (DGX H100-like): 2 × Xeon Platinum 8480C (56 cores, SMT2),
    one NUMA node per socket; each GPU shares a PCIe Gen5 switch with one ConnectX-7 400G
    InfiniBand HCA (GPU i with mlx5_i), each switch on its own root port and host bridge (one
    PCIe stack per x16 port on Sapphire Rapids); the 4 third-generation NVSwitches sit behind
    a switch on socket 1; 18 NVLink 4 links per GPU spread 5/4/4/5 over the 4 NVSwitches
    (hwloc counts 25000 MB/s per link: 125000/100000/100000/125000 per GPU-switch pair,
    450 GB/s GPU to GPU through the switches); management Ethernet eno1 (Intel X710) on
    socket 0. CUDA and NVML OS devices; the NVML matrix has a 1000000 diagonal as hwloc's
    NVML backend writes it."""
    topo = Topology()
    cpu = Cpu("Intel(R) Xeon(R) Platinum 8480C", "GenuineIntel", 2, 56, 2, 110100480, 2097152,
              49152, 1081072185344)
    pkgs = machine(topo, cpu, "h100-sxm8-node01", "DGXH100")
    pci = PciBuilder(topo)
    model = "NVIDIA H100 80GB HBM3"
    gpu_buses = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb]
    for i, bus in enumerate(gpu_buses):
        pkg = pkgs[i // 4]
        gpu = Dev("0302", "10de:2330", "10de:16c1", "a1", GEN5_X16, "NVIDIA Corporation",
                  "GH100 [H100 SXM5 80GB]",
                  [cuda_osdev(i, model, 81559, 51200, 132, 228), nvml_osdev(i, model, uuid(i))],
                  tag="gpu%d" % i)
        nic = ib_hca(i, "15b3:1021", "15b3:0041", "MT2910 Family [ConnectX-7]", GEN5_X16,
                     "ibp%ds0" % (bus + 1))
        sw = Switch(("1000:c030", "1000:100b"), "b0", GEN5_X16, "Broadcom / LSI",
                    [("00.0", gpu), ("01.0", nic)])
        # base bus = GPU bus - 3: root port -> switch upstream -> downstream -> GPU
        pci.host_bridge(pkg, bus - 3, [("01.0", sw, GEN5_X16)])
    # eno1 on socket 0
    pci.host_bridge(pkgs[0], 0x00, [("1c.0", x710_eno1("b4:96:91:a7:3c:10"), GEN3_X16)])
    switches = [Dev("0680", "10de:22a3", "10de:1796", "a1", "1.000000", "NVIDIA Corporation",
                    "GH100 [H100 NVSwitch]", subtype="NVSwitch", tag="nvswitch%d" % k)
                for k in range(4)]
    plx = Switch(("1000:c030", "1000:100b"), "b0", GEN4_X16, "Broadcom / LSI",
                 [("%02x.0" % k, switches[k]) for k in range(4)])
    pci.host_bridge(pkgs[1], 0xe0, [("01.0", plx, GEN4_X16)])

    objs = [pci.tagged["nvml%d" % i] for i in range(8)] + [pci.tagged["nvswitch%d" % k]
                                                          for k in range(4)]
    links = [5, 4, 4, 5]
    bw = {(i, i): 1000000 for i in range(12)}
    for i in range(8):
        for k in range(4):
            bw[(i, 8 + k)] = links[k] * NVLINK_MBPS
    add_nvlink_bandwidth(topo, objs, bw)
    return topo


# ---- 2. islands8_interleaved ----------------------------------------------------------------

def islands8_interleaved():
    """8 V100 SXM2 32GB with direct NVLink 2 links (no NVSwitch) forming two 4-GPU cliques
    whose members alternate in PCI bus order: {0,2,4,6} and {1,3,5,7} by CUDA index, 2 links
    (50 GB/s) per pair, nothing across. 2 × Xeon E5-2698 v4 (20 cores, SMT2), one host bridge
    per socket with two PLX PCIe switches each holding 2 GPUs (one of each island) and one
    ConnectX-4 EDR InfiniBand HCA (mlx5_0..3, netdevs ib0..3). Only NVML OS devices (no CUDA):
    CUDA order is PCI bus order, memory unknown."""
    topo = Topology()
    cpu = Cpu("Intel(R) Xeon(R) CPU E5-2698 v4 @ 2.20GHz", "GenuineIntel", 2, 20, 2, 52428800,
              262144, 32768, 270049017856)
    pkgs = machine(topo, cpu, "islands8-node01", "PowerEdge C4140")
    pci = PciBuilder(topo)
    model = "Tesla V100-SXM2-32GB"
    gpu = 0
    nic = 0
    for s, pkg in enumerate(pkgs):
        root_ports = []
        for k in range(2):
            devs = []
            for _ in range(2):
                devs.append(Dev("0302", "10de:1db5", "10de:1249", "a1", GEN3_X16,
                                "NVIDIA Corporation", "GV100GL [Tesla V100 SXM2 32GB]",
                                [nvml_osdev(gpu, model, uuid(100 + gpu))], tag="gpu%d" % gpu))
                gpu += 1
            hca = ib_hca(nic, "15b3:1013", "15b3:0013", "MT27700 Family [ConnectX-4]", GEN3_X16,
                         "ib%d" % nic)
            nic += 1
            sw = Switch(("10b5:9765", "10b5:9765"), "ab", GEN3_X16, "PLX Technology, Inc.",
                        [("08.0", hca), ("10.0", devs[0]), ("11.0", devs[1])])
            root_ports.append(("%02x.0" % (2 + k), sw, GEN3_X16))
        pci.host_bridge(pkg, 0x80 * s, root_ports, ("8086:6f04", "8086:0000"), "01")
    objs = [pci.tagged["nvml%d" % i] for i in range(8)]
    bw = {(i, i): 1000000 for i in range(8)}
    for i in range(8):
        for j in range(8):
            if i != j and i % 2 == j % 2:
                bw[(i, j)] = 2 * NVLINK_MBPS
    add_nvlink_bandwidth(topo, objs, bw)
    return topo


# ---- 3. pcie4_nvbridge ----------------------------------------------------------------------

def pcie4_nvbridge():
    """A PCIe workstation server: 1 × AMD EPYC 7543 (32 cores, SMT2, one NUMA node, a 32 MB L3
    per 4-core CCD), 4 RTX A6000 (PCI class 0300, with their HDMI audio functions) joined by
    NVLink bridges in pairs {0,1} and {2,3} (4 NVLink 3 links, 100 GB/s as hwloc counts them).
    No NVIDIA driver OS devices (only the DRM card/renderD nodes), so the GPUs are the PCI
    devices themselves and the NVLinkBandwidth matrix is between PCI devices. GPUs 0,1 and
    mlx5_0 (ConnectX-6, InfiniBand) share one PCIe switch, GPUs 2,3 and mlx5_1 (ConnectX-6
    Dx, RoCE: Ethernet link layer, Ethernet netdev) another; both switches hang off root ports
    of the same host bridge. Port1LinkLayer is given explicitly."""
    topo = Topology()
    cpu = Cpu("AMD EPYC 7543 32-Core Processor", "AuthenticAMD", 1, 32, 2, 33554432, 524288,
              32768, 540765806592, ccx_cores=4)
    pkgs = machine(topo, cpu, "ws-a6000-01", "ASUS ESC4000A-E10")
    pci = PciBuilder(topo)

    def a6000(i):
        audio = Dev("0403", "10de:1aef", "10de:1459", "a1", GEN4_X16, "NVIDIA Corporation",
                    "GA102 High Definition Audio Controller")
        return Dev("0300", "10de:2230", "10de:1459", "a1", GEN4_X16, "NVIDIA Corporation",
                   "GA102GL [RTX A6000]",
                   [OsDev("card%d" % (i + 1), OSDEV_GPU), OsDev("renderD%d" % (128 + i), OSDEV_GPU)],
                   functions=[("00.1", audio)], tag="gpu%d" % i)

    guid0, guid1 = 0x00b20000, 0x00b20100
    ib = Dev("0207", "15b3:101b", "15b3:0007", "00", GEN4_X16, "Mellanox Technologies",
             "MT28908 Family [ConnectX-6]",
             [netdev("ibp69s0", ipoib_address(guid0), 1),
              openfabrics("mlx5_0", lid=0x2a, gids=[ib_gid(guid0)], link_layer="InfiniBand",
                          guid=guid0)], tag="mlx5_0")
    roce = Dev("0200", "15b3:101d", "15b3:0016", "00", GEN4_X16, "Mellanox Technologies",
               "MT2892 Family [ConnectX-6 Dx]",
               [netdev("enp74s0np0", "0c:42:a1:5e:77:30", 1),
                openfabrics("mlx5_1", lid=0, link_layer="Ethernet", guid=guid1,
                            gids=["fe80:0000:0000:0000:0e42:a1ff:fe5e:7730",
                                  "0000:0000:0000:0000:0000:ffff:0a00:0a15"])],
               tag="mlx5_1")
    sw_a = Switch(("1000:c010", "1000:a096"), "b0", GEN4_X16, "Broadcom / LSI",
                  [("00.0", a6000(0)), ("01.0", a6000(1)), ("02.0", ib)])
    sw_b = Switch(("1000:c010", "1000:a096"), "b0", GEN4_X16, "Broadcom / LSI",
                  [("00.0", a6000(2)), ("01.0", a6000(3)), ("02.0", roce)])
    pci.host_bridge(pkgs[0], 0x40, [("01.1", sw_a, GEN4_X16), ("03.1", sw_b, GEN4_X16)],
                    ("1022:1483", "0000:0000"), "00")
    objs = [pci.tagged["gpu%d" % i] for i in range(4)]
    bw = {(0, 1): 4 * NVLINK_MBPS, (2, 3): 4 * NVLINK_MBPS}
    add_nvlink_bandwidth(topo, objs, bw)
    return topo


# ---- 4. nvswitch16 --------------------------------------------------------------------------

def nvswitch16():
    """A DGX-2: 16 V100-SXM3-32GB-H on two baseboards of 8, each baseboard with 6 first-
    generation NVSwitches; every GPU has one NVLink 2 link to each of the 6 switches of its
    own baseboard (the baseboards are joined switch to switch, links hwloc does not list), so
    the NVML matrix alone connects a GPU only to its own baseboard's switches: closing it
    through the switch fabric (hwloc's TRANSITIVE_CLOSURE rule: min of the two GPUs' total
    switch bandwidth) gives 150 GB/s between any two of the 16 GPUs. 2 × Xeon Platinum 8168
    (24 cores, SMT2); per socket two host bridges, each with a two-level PLX tree: two leaf
    switches each holding a GPU pair and its ConnectX-5 EDR InfiniBand HCA, and a third
    holding 3 NVSwitches. CUDA and NVML OS devices; matrix diagonal 0 as older hwloc wrote."""
    topo = Topology()
    cpu = Cpu("Intel(R) Xeon(R) Platinum 8168 CPU @ 2.70GHz", "GenuineIntel", 2, 24, 2, 34603008,
              1048576, 32768, 810234351616)
    pkgs = machine(topo, cpu, "dgx2-node01", "NVIDIA DGX-2")
    pci = PciBuilder(topo)
    model = "Tesla V100-SXM3-32GB-H"
    plx = (("10b5:9781", "10b5:9781"), "b0", GEN3_X16, "PLX Technology, Inc.")
    gpu = nic = sw_index = 0
    for s, pkg in enumerate(pkgs):
        for h in range(2):
            leaves = []
            for _ in range(2):
                pair = []
                for _ in range(2):
                    pair.append(Dev("0302", "10de:1db8", "10de:131d", "a1", GEN3_X16,
                                    "NVIDIA Corporation", "GV100GL [Tesla V100 SXM3 32GB]",
                                    [cuda_osdev(gpu, model, 32510, 6144, 80, 96),
                                     nvml_osdev(gpu, model, uuid(200 + gpu))],
                                    tag="gpu%d" % gpu))
                    gpu += 1
                hca = ib_hca(nic, "15b3:1017", "15b3:0007", "MT27800 Family [ConnectX-5]",
                             GEN3_X16, "ib%d" % nic)
                nic += 1
                leaves.append(Switch(*plx, [("00.0", pair[0]), ("08.0", hca), ("10.0", pair[1])]))
            nvsw = []
            for k in range(3):
                nvsw.append(Dev("0680", "10de:1ac2", "0000:0000", "a1", "1.000000",
                                "NVIDIA Corporation", "GV100 NVSwitch", subtype="NVSwitch",
                                tag="nvswitch%d" % sw_index))
                sw_index += 1
            sw_tree = Switch(("10b5:8725", "10b5:8725"), "ca", "3.938462", "PLX Technology, Inc.",
                             [("%02x.0" % (2 + k), nvsw[k]) for k in range(3)])
            level1 = Switch(*plx, [("04.0", leaves[0]), ("0c.0", leaves[1]), ("10.0", sw_tree)])
            base = [0x2b, 0x4e, 0xb0, 0xd9][s * 2 + h]
            pci.host_bridge(pkg, base, [("00.0", level1, GEN3_X16)], ("8086:2030", "8086:0000"))
    objs = [pci.tagged["nvml%d" % i] for i in range(16)] + [pci.tagged["nvswitch%d" % k]
                                                           for k in range(12)]
    bw = {}
    for i in range(16):
        board = i // 8
        for k in range(6):
            bw[(i, 16 + board * 6 + k)] = NVLINK_MBPS
    add_nvlink_bandwidth(topo, objs, bw)
    return topo


# ---- 5. cpu_only ----------------------------------------------------------------------------

def cpu_only():
    """A CPU server: 2 × Xeon Gold 6346 (16 cores, SMT2), one Intel E810 Ethernet port (ens1f0),
    an NVMe disk and the BMC's ASPEED VGA (a display controller that is not an NVIDIA GPU)."""
    topo = Topology()
    cpu = Cpu("Intel(R) Xeon(R) Gold 6346 CPU @ 3.10GHz", "GenuineIntel", 2, 16, 2, 37748736,
              1310720, 49152, 270049017856)
    pkgs = machine(topo, cpu, "cpu-node01", "PowerEdge R750")
    pci = PciBuilder(topo)
    vga = Dev("0300", "1a03:2000", "1028:0b1a", "52", "0.250000", "ASPEED Technology, Inc.",
              "ASPEED Graphics Family")
    bmc_bridge = Switch(("1a03:1150", "1a03:1150"), "06", "0.250000", "ASPEED Technology, Inc.",
                        [("00.0", vga)])
    nvme = Dev("0108", "144d:a824", "1028:2112", "00", GEN4_X16, "Samsung Electronics Co Ltd",
               "NVMe SSD Controller PM173X", [OsDev("nvme0n1", OSDEV_BLOCK, "Disk",
                                                    [("Size", 3750738264), ("SectorSize", 512)])])
    pci.host_bridge(pkgs[0], 0x00, [("1c.4", bmc_bridge, "0.250000"), ("1c.5", nvme, GEN4_X16)])
    e810 = Dev("0200", "8086:159b", "8086:0003", "02", GEN4_X16, "Intel Corporation",
               "Ethernet Controller E810-C for SFP", [netdev("ens1f0", "b4:96:91:c2:10:a8")])
    pci.host_bridge(pkgs[1], 0x98, [("02.0", e810, GEN4_X16)])
    return topo


# ---- 6. pci_ids_only ----------------------------------------------------------------------

def pci_ids_only():
    """What hwloc sees of a GPU node without NVIDIA's libraries and without pci.ids (a
    container image, say): a 1-socket Xeon Platinum 8480C (56 cores, SMT2) with two H100
    SXM5 GPUs (10de:2330) and one GPU plait does not know (10de:2684), each on its own root
    port and host bridge, known only by their PCI ids: no CUDA or NVML OS devices, no
    PCIVendor/PCIDevice names, no NVLink matrix."""
    topo = Topology()
    cpu = Cpu("Intel(R) Xeon(R) Platinum 8480C", "GenuineIntel", 1, 56, 2, 110100480, 2097152,
              49152, 540536092672)
    pkgs = machine(topo, cpu, "h100-pci-only-node01", "PowerEdge XE9680")
    pci = PciBuilder(topo)
    for i, (bus, ids) in enumerate([(0x18, "10de:2330"), (0x2a, "10de:2330"),
                                    (0x3a, "10de:2684")]):
        gpu = Dev("0302", ids, "10de:16c1", "a1", GEN5_X16, None, None, tag="gpu%d" % i)
        pci.host_bridge(pkgs[0], bus - 1, [("01.0", gpu, GEN5_X16)])
    return topo


# ---- 7. opencl_l4 -------------------------------------------------------------------------

def opencl_osdev(index, model, mem_mib, units):
    """What hwloc's OpenCL backend adds to a GPU (hwloc 2.x: a COPROC OS device named
    openclPdD, subtype OpenCL; OpenCLGlobalMemorySize in kB)."""
    return OsDev("opencl0d%d" % index, OSDEV_COPROC, "OpenCL",
                 [("Backend", "OpenCL"), ("OpenCLDeviceType", "GPU"),
                  ("GPUVendor", "NVIDIA Corporation"), ("GPUModel", model),
                  ("OpenCLPlatformIndex", 0), ("OpenCLPlatformName", "NVIDIA CUDA"),
                  ("OpenCLPlatformDeviceIndex", index), ("OpenCLComputeUnits", units),
                  ("OpenCLGlobalMemorySize", mem_mib * 1024)])


def opencl_l4():
    """An inference node with two L4 GPUs (10de:27b8) that hwloc describes through its
    OpenCL backend only (no CUDA or NVML OS devices): 1 × EPYC 9124 (16 cores, SMT2), each
    GPU on its own root port."""
    topo = Topology()
    cpu = Cpu("AMD EPYC 9124 16-Core Processor", "AuthenticAMD", 1, 16, 2, 67108864, 1048576,
              32768, 270049017856)
    pkgs = machine(topo, cpu, "l4-node01", "PowerEdge R7615")
    pci = PciBuilder(topo)
    for i, bus in enumerate([0x41, 0x61]):
        gpu = Dev("0302", "10de:27b8", "10de:16ca", "a1", "15.753846", "NVIDIA Corporation",
                  "AD104GL [L4]", [opencl_osdev(i, "NVIDIA L4", 23034, 58)], tag="gpu%d" % i)
        pci.host_bridge(pkgs[0], bus - 1, [("01.0", gpu, GEN4_X16)],
                        root_port_ids=("1022:14ab", "1022:1453"), root_port_rev="00")
    return topo


# ---- 8. h100_pcie1 ------------------------------------------------------------------------

def h100_pcie1():
    """A one-GPU workstation, as the GPU machines this project is lent are: 1 × Xeon w5-3435X
    (16 cores, SMT2) with one H100 PCIe 80GB (10de:2331) on its own root port, CUDA and NVML
    OS devices (no NVLink), and Ethernet eno1. Several ranks reach a GPU here only by sharing
    it (PLAIT_RANKS_PER_GPU)."""
    topo, model = Topology(), "NVIDIA H100 PCIe"
    pkgs = machine(topo, Cpu("Intel(R) Xeon(R) w5-3435X", "GenuineIntel", 1, 16, 2, 47185920,
                             2097152, 49152, 270049017856), "h100-pcie-ws01", "Precision 7960 Tower")
    osdevs = [cuda_osdev(0, model, 81559, 51200, 114, 228), nvml_osdev(0, model, uuid(0))]
    gpu = Dev("0302", "10de:2331", "10de:1626", "a1", GEN5_X16, "NVIDIA Corporation",
              "GH100 [H100 PCIe]", osdevs, tag="gpu0")
    pci = PciBuilder(topo)
    pci.host_bridge(pkgs[0], 0x17, [("01.0", gpu, GEN5_X16)])
    pci.host_bridge(pkgs[0], 0x00, [("1c.0", x710_eno1("b4:96:91:a7:3c:20"), GEN3_X16)])
    return topo


CASES = {
    "h100_sxm8": h100_sxm8,
    "islands8_interleaved": islands8_interleaved,
    "pcie4_nvbridge": pcie4_nvbridge,
    "nvswitch16": nvswitch16,
    "cpu_only": cpu_only,
    "pci_ids_only": pci_ids_only,
    "opencl_l4": opencl_l4,
    "h100_pcie1": h100_pcie1,
}


def main():
    for name, make in CASES.items():
        path = os.path.join(HERE, name, "topology.xml")
        make().write(path)
        print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()
