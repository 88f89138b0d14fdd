import subprocess, sys, time, os, socket, struct
b = sys.argv[1]; s = "/tmp/np/idle.sock"
if os.path.exists(s): os.unlink(s)
p = subprocess.Popen(["taskset", "-c", "1", b, "--disk", "/dev/shm/np-disk.raw", "--log-level", "warn", "--nbd", "unix:" + s])
while not os.path.exists(s): time.sleep(0.02)
time.sleep(0.1)
c = socket.socket(socket.AF_UNIX); c.connect(s)
def rd(n):
    d = b""
    while len(d) < n: d += c.recv(n - len(d))
    return d
rd(18); c.sendall(struct.pack(">I", 3))
c.sendall(struct.pack(">QII", 0x49484156454F5054, 1, 0)); rd(10)
t = time.time(); n = 0
while time.time() - t < 1.0:
    c.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, n, (n * 7919 % 200000) * 4096, 4096))
    rd(16 + 4096); n += 1
def cpu(): 
    f = open("/proc/%d/stat" % p.pid).read().rsplit(")", 1)[1].split(); return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
c0 = cpu(); t0 = time.time()
time.sleep(5)
c1 = cpu(); t1 = time.time()
print("%s: %d QD1 reads in 1 s, then silent and connected: %.2f%% CPU over %.1f s" % (os.path.basename(b), n, 100 * (c1 - c0) / (t1 - t0), t1 - t0))
c.close(); p.terminate(); p.wait()
