use super::*;

fn quickack(l: &std::net::TcpListener) -> libc::c_int {
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket; v and len are valid for writes.
    let r = unsafe {
        libc::getsockopt(
            l.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0);
    v
}

#[test]
fn listener_delays_the_request_ack_for_the_response() {
    let l = listener("127.0.0.1:0".parse().unwrap()).unwrap();
    assert_eq!(quickack(&l), 0);
}
