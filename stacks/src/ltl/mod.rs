//! placeholder
#![allow(missing_docs)]
use std::sync::Arc;
#[derive(Default)]
pub struct LtlStack;
impl LtlStack { pub fn new() -> Self { LtlStack } }
impl uniplane_dataplane::Stack for LtlStack {
    fn name(&self) -> &'static str { "ltl" }
    fn capabilities(&self) -> uniplane_dataplane::Capabilities { todo!() }
    fn connect(&self, _: &uniplane_dataplane::Locator) -> uniplane_dataplane::StackFuture<'_, uniplane_dataplane::BoxLink> { todo!() }
    fn listen(&self, _: &uniplane_dataplane::Locator) -> uniplane_dataplane::StackFuture<'_, uniplane_dataplane::BoxListener> { todo!() }
}
#[allow(dead_code)] fn _x(_: Arc<()>) {}
