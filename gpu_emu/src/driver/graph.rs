//! CUDA graphs from stream capture: a graph is the captured work in issue order (a valid
//! topological order of the captured dependencies); launching it replays that work, in
//! that order, as one item of the launch stream.

use std::sync::Arc;

use super::context::tri;
use super::registry::Registry;
use super::stream::{lookup, Item};
use super::{codes, refuse, write_out, CUresult, Handle};

/// A captured graph, or an instantiated one (the same contents).
pub struct Graph {
    pub items: Vec<Item>,
}

pub static GRAPHS: Registry<Graph> = Registry::new(0x6A);
pub static EXECS: Registry<Graph> = Registry::new(0x6E);

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut Handle,
    graph: Handle,
    _flags: u64,
) -> CUresult {
    let Some(g) = GRAPHS.get(graph) else {
        return refuse(
            codes::INVALID_HANDLE,
            "cuGraphInstantiate",
            format!("{graph:?} is not a live graph"),
        );
    };
    let e = EXECS.insert(Arc::new(Graph {
        items: g.items.clone(),
    }));
    write_out(exec, e, "cuGraphInstantiate")
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut Handle,
    graph: Handle,
    _error_node: *mut Handle,
    _log: *mut std::ffi::c_char,
    _log_size: usize,
) -> CUresult {
    cuGraphInstantiateWithFlags(exec, graph, 0)
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: Handle, h: Handle) -> CUresult {
    let Some(g) = EXECS.get(exec) else {
        return refuse(
            codes::INVALID_HANDLE,
            "cuGraphLaunch",
            format!("{exec:?} is not a live graph exec"),
        );
    };
    let s = tri!(lookup(h, "cuGraphLaunch"));
    let n = g.items.len();
    s.submit(
        format!("cuGraphLaunch ({n} nodes)"),
        Arc::new(move || {
            for item in &g.items {
                (item.op)().map_err(|mut f| {
                    f.msg = format!("graph node `{}`: {}", item.what, f.msg);
                    f
                })?;
            }
            Ok(())
        }),
    );
    codes::SUCCESS
}

/// Uploading is a no-op: the graph's work already lives in host memory.
#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: Handle, h: Handle) -> CUresult {
    if EXECS.get(exec).is_none() {
        return refuse(
            codes::INVALID_HANDLE,
            "cuGraphUpload",
            format!("{exec:?} is not a live graph exec"),
        );
    }
    tri!(lookup(h, "cuGraphUpload"));
    codes::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: Handle) -> CUresult {
    match EXECS.remove(exec) {
        Some(_) => codes::SUCCESS,
        None => refuse(
            codes::INVALID_HANDLE,
            "cuGraphExecDestroy",
            format!("{exec:?} is not a live graph exec"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: Handle) -> CUresult {
    match GRAPHS.remove(graph) {
        Some(_) => codes::SUCCESS,
        None => refuse(
            codes::INVALID_HANDLE,
            "cuGraphDestroy",
            format!("{graph:?} is not a live graph"),
        ),
    }
}
