//! The UDP socket of a QUIC endpoint, with its kernel receive buffer sized.

use std::net::{SocketAddr, UdpSocket};

use socket2::{Domain, Protocol, Socket, Type};

/// The receive buffer a UDP socket was asked for and the one it got (both in bytes of
/// data, as `SO_RCVBUF` is set; the kernel reports twice that, counting its overhead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpReceiveBuffer {
    /// 0: the system default was left alone.
    pub wanted: u64,
    pub got: u64,
}

/// Binds a UDP socket for a QUIC endpoint and sizes its kernel receive buffer to `want`
/// bytes (0: the system default). A QUIC receiver that falls behind for a moment — its
/// thread preempted on a busy host — loses whatever overflows the buffer, and the sender's
/// congestion control takes each loss as congestion; the Linux default (208 KiB) holds
/// about 2 ms at 100 MB/s. `SO_RCVBUF` is capped at `net.core.rmem_max`; beyond it
/// `SO_RCVBUFFORCE` is tried, which needs `CAP_NET_ADMIN`. A short grant is logged as a
/// warning.
///
/// socket2 makes and binds the socket and sets `SO_RCVBUF`; it has no `SO_RCVBUFFORCE`,
/// which rustix sets (both without `unsafe` here).
pub fn bind_udp(addr: SocketAddr, want: u64) -> std::io::Result<(UdpSocket, UdpReceiveBuffer)> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // Close-on-exec, and for IPv6 the system's default dual-stack setting, as
    // `std::net::UdpSocket::bind` leaves them.
    socket.bind(&addr.into())?;
    // The kernel reports the doubled value it keeps (data plus its bookkeeping).
    let read = |s: &Socket| -> std::io::Result<u64> { Ok(s.recv_buffer_size()? as u64 / 2) };
    if want == 0 {
        let got = read(&socket)?;
        return Ok((socket.into(), UdpReceiveBuffer { wanted: 0, got }));
    }
    let v = usize::try_from(want)
        .ok()
        .filter(|v| i32::try_from(*v).is_ok())
        .unwrap_or(i32::MAX as usize / 2);
    socket.set_recv_buffer_size(v)?;
    let mut got = read(&socket)?;
    if got < want && rustix::net::sockopt::set_socket_recv_buffer_size_force(&socket, v).is_ok() {
        got = read(&socket)?;
    }
    if got < want {
        tracing::warn!(
            %addr,
            wanted = want,
            got,
            "quic.udp-receive-buffer: the kernel gave the UDP socket less receive buffer than \
             configured; raise net.core.rmem_max or grant CAP_NET_ADMIN (a short buffer drops \
             datagrams under load, and QUIC slows down for each loss)"
        );
    }
    Ok((socket.into(), UdpReceiveBuffer { wanted: want, got }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The receive buffer is raised to what was asked (up to `rmem_max`, past it with
    /// `CAP_NET_ADMIN`), and 0 leaves the default alone.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn udp_receive_buffer_is_sized() {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let (_s, default) = bind_udp(any, 0).unwrap();
        assert_eq!(default.wanted, 0);
        assert!(default.got > 0);
        let want = (default.got * 4).max(1 << 20);
        let (_s, b) = bind_udp(any, want).unwrap();
        assert_eq!(b.wanted, want);
        let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        // Without the capability the kernel caps it at rmem_max; with it, it is what was asked.
        assert!(
            b.got >= want.min(rmem_max).max(default.got + 1),
            "{b:?} default {default:?} rmem_max {rmem_max}"
        );
    }

    /// The socket is bound where asked and passes datagrams (IPv4 and, where the host has
    /// it, IPv6 loopback).
    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_socket_is_bound_and_carries_datagrams() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let Ok((a, _)) = bind_udp(addr, 0) else {
                eprintln!("{addr}: not available on this host; skipped");
                continue;
            };
            let (b, _) = bind_udp(addr, 1 << 20).unwrap();
            assert_eq!(a.local_addr().unwrap().ip(), addr.ip());
            assert_ne!(a.local_addr().unwrap().port(), 0);
            b.send_to(b"ping", a.local_addr().unwrap()).unwrap();
            let mut buf = [0u8; 8];
            a.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            let (n, from) = a.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"ping");
            assert_eq!(from, b.local_addr().unwrap());
        }
    }
}
