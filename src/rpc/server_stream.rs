//! The server side of one RPC connection: plain TCP or TLS over it, and the hand-over of
//! either from a shard's runtime to the side runtime.
//!
//! A tokio socket belongs to the runtime that registered it, so a connection moves as a std
//! socket ([`ServerStream::detach`], then [`Detached::attach`] on the new runtime). A TLS
//! session keeps its state across the move: it runs over [`MovableTcp`], whose socket is taken
//! out and put back in.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TCP socket that can be taken out from under a TLS session (then every I/O fails with
/// `NotConnected` until it is put back). Owned by its session; not shared.
pub(super) struct MovableTcp(Option<TcpStream>);

impl MovableTcp {
    pub(super) fn new(tcp: TcpStream) -> MovableTcp {
        MovableTcp(Some(tcp))
    }

    fn socket(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        match &mut self.0 {
            Some(tcp) => Ok(Pin::new(tcp)),
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }
}

impl AsyncRead for MovableTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.socket() {
            Ok(tcp) => tcp.poll_read(cx, buf),
            Err(err) => Poll::Ready(Err(err)),
        }
    }
}

impl AsyncWrite for MovableTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.socket() {
            Ok(tcp) => tcp.poll_write(cx, buf),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.socket() {
            Ok(tcp) => tcp.poll_flush(cx),
            Err(err) => Poll::Ready(Err(err)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.socket() {
            Ok(tcp) => tcp.poll_shutdown(cx),
            Err(err) => Poll::Ready(Err(err)),
        }
    }
}

/// A TLS session over a movable socket.
pub(super) type TlsSession = tokio_rustls::server::TlsStream<MovableTcp>;

/// One accepted connection, plain or TLS.
pub(super) enum ServerStream {
    Plain(TcpStream),
    Tls(Box<TlsSession>),
}

/// A connection taken off its runtime: the std socket, and the TLS session that runs over it.
pub(super) struct Detached {
    socket: std::net::TcpStream,
    tls: Option<Box<TlsSession>>,
}

impl ServerStream {
    /// Takes the connection off the current runtime.
    ///
    /// Errors: the socket's, when it cannot be deregistered.
    pub(super) fn detach(self) -> io::Result<Detached> {
        match self {
            ServerStream::Plain(tcp) => Ok(Detached {
                socket: tcp.into_std()?,
                tls: None,
            }),
            ServerStream::Tls(mut session) => {
                let tcp = session.get_mut().0 .0.take();
                let tcp = tcp.ok_or(io::ErrorKind::NotConnected)?;
                Ok(Detached {
                    socket: tcp.into_std()?,
                    tls: Some(session),
                })
            }
        }
    }
}

impl Detached {
    /// Puts the connection on the runtime this runs in.
    ///
    /// Errors: the socket's, when it cannot be registered.
    pub(super) fn attach(self) -> io::Result<ServerStream> {
        let tcp = TcpStream::from_std(self.socket)?;
        Ok(match self.tls {
            None => ServerStream::Plain(tcp),
            Some(mut session) => {
                session.get_mut().0 .0 = Some(tcp);
                ServerStream::Tls(session)
            }
        })
    }
}

impl AsyncRead for ServerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            ServerStream::Tls(session) => Pin::new(session.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            ServerStream::Tls(session) => Pin::new(session.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            ServerStream::Tls(session) => Pin::new(session.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            ServerStream::Tls(session) => Pin::new(session.as_mut()).poll_shutdown(cx),
        }
    }
}
