//! The embedding piece: token embedding plus learned positions (GPT), or the token
//! embedding alone (Llama, whose positions are rotary, in the blocks).

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::ops;
use crate::param::{Init, Param};

/// Token and position tables.
#[derive(Debug, Clone)]
pub(crate) struct Embedding {
    /// `[V, h]`.
    pub(crate) wte: Param,
    /// `[seq_len, h]`; none for Llama.
    pub(crate) wpe: Option<Param>,
}

/// Held from `F` to `B`: the token ids `[b, t]`.
#[derive(Debug)]
pub(crate) struct ForwardStash {
    ids: Tensor,
}

/// Held from `B` to `W`: the ids and the output gradient `[N, h]`.
#[derive(Debug)]
pub(crate) struct WeightStash {
    ids: Tensor,
    dy: Tensor,
}

impl ForwardStash {
    pub(crate) fn bytes(&self) -> u64 {
        ops::bytes(&self.ids)
    }
}

impl WeightStash {
    pub(crate) fn bytes(&self) -> u64 {
        ops::bytes(&self.ids) + ops::bytes(&self.dy)
    }
}

impl Embedding {
    pub(crate) fn new(
        vocab: usize,
        hidden: usize,
        seq_len: Option<usize>,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let p = |name: &str, rows: usize| {
            Param::new(
                format!("embedding.{name}"),
                &[rows, hidden],
                Init::Normal(0.02),
                true,
                seed,
                dtype,
                device,
            )
        };
        Ok(Self {
            wte: p("wte", vocab)?,
            wpe: seq_len.map(|t| p("wpe", t)).transpose()?,
        })
    }

    pub(crate) fn params(&self) -> Vec<&Param> {
        let mut params = vec![&self.wte];
        params.extend(&self.wpe);
        params
    }

    pub(crate) fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut params = vec![&mut self.wte];
        params.extend(&mut self.wpe);
        params
    }

    /// `ids: [b, t]` (u32) → `[N, h]`.
    pub(crate) fn forward(&self, ids: &Tensor) -> Result<(Tensor, ForwardStash)> {
        let (b, t) = ids.dims2()?;
        let h = self.wte.value.dim(1)?;
        let x = self.wte.value.index_select(&ids.flatten_all()?, 0)?;
        let Some(wpe) = &self.wpe else {
            return Ok((x, ForwardStash { ids: ids.clone() }));
        };
        let pos = wpe.value.narrow(0, 0, t)?;
        let out = x
            .reshape((b, t, h))?
            .broadcast_add(&pos)?
            .reshape((b * t, h))?;
        Ok((out, ForwardStash { ids: ids.clone() }))
    }

    /// Token ids take no gradient: `B` only keeps the output gradient for `W`.
    pub(crate) fn backward_input(&self, f: ForwardStash, dy: Tensor) -> WeightStash {
        WeightStash { ids: f.ids, dy }
    }

    /// `dwte[id] += dy` row by row (in token order), `dwpe[p] += Σ_b dy[b, p]`.
    pub(crate) fn backward_weight(&mut self, w: WeightStash) -> Result<()> {
        let (b, t) = w.ids.dims2()?;
        let dy_wide = w.dy.to_dtype(self.wte.grad.dtype())?.contiguous()?;
        if !add_rows_in_place(&self.wte.grad, &w.ids, &dy_wide)? {
            let dwte = self
                .wte
                .grad
                .index_add(&w.ids.flatten_all()?, &dy_wide, 0)?;
            self.wte.grad = dwte;
        }
        let Some(wpe) = &mut self.wpe else {
            return Ok(());
        };
        let (seq_len, h) = wpe.value.dims2()?;
        let mut dwpe = dy_wide.reshape((b, t, h))?.sum(0)?;
        if t < seq_len {
            let pad = Tensor::zeros((seq_len - t, h), dwpe.dtype(), dwpe.device())?;
            dwpe = Tensor::cat(&[&dwpe, &pad], 0)?;
        }
        wpe.accumulate(&dwpe)
    }
}

/// `grad[ids[k]] += dy[k]` for each token `k` in order (the order `index_add` adds in, so
/// the same sums), in place in a contiguous f64 CPU gradient: a step holds the table's
/// gradient once, not a second table beside it for every microbatch. `false`, having
/// changed nothing, where that does not apply.
fn add_rows_in_place(grad: &Tensor, ids: &Tensor, dy: &Tensor) -> Result<bool> {
    let ids = ids.flatten_all()?.to_vec1::<u32>()?;
    let (rows, h) = grad.dims2()?;
    let Some(dy) = crate::kernels::cpu::with_f64(dy, <[f64]>::to_vec) else {
        return Ok(false);
    };
    if dy.len() != ids.len() * h || ids.iter().any(|&id| id as usize >= rows) {
        return Ok(false);
    }
    let added = crate::kernels::cpu::with_f64_mut(grad, |g| {
        for (&id, d) in ids.iter().zip(dy.chunks_exact(h)) {
            let at = id as usize * h;
            for (x, d) in g[at..at + h].iter_mut().zip(d) {
                *x += d;
            }
        }
    })?;
    Ok(added.is_some())
}
