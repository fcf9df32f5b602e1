//! The identity layer: authorize a call by the caller's overlay source
//! UID, which the daemon installed with the connection (an application
//! cannot choose it), before the service sees the call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::{Layer, Service};
use uniplane_dataplane::Endpoint;

use crate::server::ServerCall;
use crate::status::{Code, Status};

/// Lets a call through only when `allow(caller)` says so; others end
/// with `PermissionDenied` and never reach the service.
#[derive(Clone)]
pub struct AuthorizeLayer {
    allow: Arc<dyn Fn(Endpoint) -> bool + Send + Sync>,
}

impl AuthorizeLayer {
    /// A layer that asks `allow` about each caller.
    pub fn new(allow: impl Fn(Endpoint) -> bool + Send + Sync + 'static) -> AuthorizeLayer {
        AuthorizeLayer {
            allow: Arc::new(allow),
        }
    }
}

impl<S> Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Authorize<S> {
        Authorize {
            inner,
            allow: self.allow.clone(),
        }
    }
}

/// The service [`AuthorizeLayer`] makes.
#[derive(Clone)]
pub struct Authorize<S> {
    inner: S,
    allow: Arc<dyn Fn(Endpoint) -> bool + Send + Sync>,
}

impl<S> Service<ServerCall> for Authorize<S>
where
    S: Service<ServerCall>,
    S::Response: Send + 'static,
    S::Error: Into<Status>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Status>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        let peer = call.peer();
        if !(self.allow)(peer) {
            return Box::pin(std::future::ready(Err(Status::new(
                Code::PermissionDenied,
                format!("{} may not call {}", peer.uid, call.method()),
            ))));
        }
        let fut = self.inner.call(call);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }
}
