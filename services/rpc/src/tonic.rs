//! tonic over uniplane: the server's incoming streams and the client's
//! connector, both [`ByteStream`]s.
//!
//! ```rust,ignore
//! // Server: every connection to port 50051 of this session.
//! let listener = session.listen(50051).await?;
//! Server::builder()
//!     .add_service(EchoServer::new(MyEcho))
//!     .serve_with_incoming(uniplane_rpc::tonic::incoming(listener))
//!     .await?;
//! // Client: the URI is only a name; the connector dials the UID.
//! let channel = Endpoint::from_static("http://uniplane")
//!     .connect_with_connector(UidConnector::new(session, server_uid.port(50051)))
//!     .await?;
//! ```
//!
//! A service reads the caller's UID from the request's extensions:
//! `request.extensions().get::<PeerInfo>()` (tonic's `Connected`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use hyper_util::rt::TokioIo;
use tower::Service;
use uniplane_client::{ClientError, Listener, Session};
use uniplane_dataplane::Endpoint;

use crate::ByteStream;

/// Who is at the other end of a tonic connection over uniplane: a
/// request extension on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The caller's end, as the daemon installed the connection.
    pub remote: Endpoint,
    /// The server's end.
    pub local: Endpoint,
}

impl tonic::transport::server::Connected for ByteStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        PeerInfo {
            remote: self.remote(),
            local: self.local(),
        }
    }
}

/// The connections of `listener` as byte streams, for
/// `Server::serve_with_incoming`; ends when the session does.
pub fn incoming(listener: Listener) -> impl Stream<Item = Result<ByteStream, std::io::Error>> {
    futures_util::stream::unfold(listener, |mut l| async move {
        l.accept().await.map(|c| (Ok(ByteStream::accepted(c)), l))
    })
}

/// Dials one uniplane endpoint whatever URI tonic asks for: tonic's
/// `Endpoint` needs a URI, uniplane names the server by UID.
#[derive(Clone)]
pub struct UidConnector {
    session: Arc<Session>,
    to: Endpoint,
}

impl UidConnector {
    /// Connections from `session` to `to`.
    pub fn new(session: Arc<Session>, to: Endpoint) -> UidConnector {
        UidConnector { session, to }
    }
}

impl Service<http::Uri> for UidConnector {
    type Response = TokioIo<ByteStream>;
    type Error = ClientError;
    type Future = Pin<Box<dyn Future<Output = Result<TokioIo<ByteStream>, ClientError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ClientError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let (session, to) = (self.session.clone(), self.to);
        Box::pin(async move {
            let conn = session.connect(to).await?;
            Ok(TokioIo::new(ByteStream::connected(conn)))
        })
    }
}

/// The Echo service (`proto/echo.proto`) in tonic, as the example and
/// the benchmark serve it: each method answers with what it was sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct EchoService;

type PayloadStream =
    Pin<Box<dyn Stream<Item = Result<crate::echo::Payload, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl crate::echo::echo_server::Echo for EchoService {
    async fn unary(
        &self,
        request: tonic::Request<crate::echo::Payload>,
    ) -> Result<tonic::Response<crate::echo::Payload>, tonic::Status> {
        Ok(tonic::Response::new(request.into_inner()))
    }

    type ServerStreamStream = PayloadStream;

    async fn server_stream(
        &self,
        request: tonic::Request<crate::echo::Repeat>,
    ) -> Result<tonic::Response<PayloadStream>, tonic::Status> {
        let crate::echo::Repeat { data, count } = request.into_inner();
        let items = (0..count).map(move |_| Ok(crate::echo::Payload { data: data.clone() }));
        Ok(tonic::Response::new(Box::pin(futures_util::stream::iter(
            items,
        ))))
    }

    async fn client_stream(
        &self,
        request: tonic::Request<tonic::Streaming<crate::echo::Payload>>,
    ) -> Result<tonic::Response<crate::echo::Payload>, tonic::Status> {
        use futures_util::StreamExt;
        let mut stream = request.into_inner();
        let mut all = bytes::BytesMut::new();
        while let Some(p) = stream.next().await {
            all.extend_from_slice(&p?.data);
        }
        Ok(tonic::Response::new(crate::echo::Payload {
            data: all.freeze(),
        }))
    }

    type BidiStream = PayloadStream;

    async fn bidi(
        &self,
        request: tonic::Request<tonic::Streaming<crate::echo::Payload>>,
    ) -> Result<tonic::Response<PayloadStream>, tonic::Status> {
        Ok(tonic::Response::new(Box::pin(request.into_inner())))
    }
}
