//! The built-in template's `haproxy.cfg` cut around its servers: the text between one server's
//! address-and-words and the next stays the same while only endpoints change (the same backends
//! with the same server slots), so an endpoint-only render fills the holes instead of running
//! the template again over every backend.
//!
//! Owns cutting the text and filling it. It must never give a config the template would not:
//! a skeleton is kept only once filling it with the very model it was cut from gave the
//! template's own output byte for byte, and it fills only a model of the same shape (backend
//! and server names, in order); anything else is the caller's full template render.

use crate::model::{Model, Server};
use crate::template::{render_with_holes, server_text, Templates};
use crate::RenderError;

/// Where a server's address and words go: text no config holds (a config holding it anyway
/// cuts into too many parts, and the skeleton is not kept).
const HOLE: &str = "\u{1}haptic-server\u{1}";

/// `haproxy.cfg` around its servers' addresses and words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skeleton {
    /// The text before the first server's address, between each server's words and the next
    /// address, and after the last: one more than there are servers.
    parts: Vec<String>,
    /// What the parts hold for: each backend's name and its servers' names, in model order.
    shape: Vec<(String, Vec<String>)>,
    /// And the template and snippets they were cut with.
    templates: Templates,
    /// What the last fill wrote into each hole, and of which server (and whether its backend
    /// has affinity, the one backend option a server's text reads): a server the same as then
    /// is written again without formatting it.
    texts: Vec<(bool, Server, String)>,
}

fn shape_of(model: &Model) -> Vec<(String, Vec<String>)> {
    model.backends.iter().map(|b| (b.name.clone(), b.servers.iter().map(|s| s.name.clone()).collect())).collect()
}

impl Skeleton {
    /// The skeleton of `model` under `t`, proven against `full` (the template's output for
    /// `model`); `None` when `t` is an admin's template or the proof fails.
    pub fn cut(model: &Model, t: &Templates, full: &str) -> Result<Option<Skeleton>, RenderError> {
        let Some(holed) = render_with_holes(model, t, HOLE)? else { return Ok(None) };
        let parts: Vec<String> = holed.split(HOLE).map(str::to_string).collect();
        let mut skeleton = Skeleton { parts, shape: shape_of(model), templates: t.clone(), texts: Vec::new() };
        Ok(skeleton.fill(model, t).filter(|f| f == full).map(|_| skeleton))
    }

    /// `haproxy.cfg` for `model` under `t`, when they are the backends, server slots and
    /// templates this skeleton was cut for.
    pub fn fill(&mut self, model: &Model, t: &Templates) -> Option<String> {
        let servers: usize = self.shape.iter().map(|(_, s)| s.len()).sum();
        let same = self.parts.len() == servers + 1
            && self.templates == *t
            && self.shape.len() == model.backends.len()
            && self.shape.iter().zip(&model.backends).all(|((name, names), b)| {
                *name == b.name
                    && names.len() == b.servers.len()
                    && names.iter().zip(&b.servers).all(|(n, s)| *n == s.name)
            });
        if !same {
            return None;
        }
        let mut out = String::with_capacity(self.parts.iter().map(String::len).sum::<usize>() + servers * 32);
        let mut parts = self.parts.iter();
        out.push_str(parts.next()?);
        let last = std::mem::take(&mut self.texts);
        let mut last = last.into_iter();
        for b in &model.backends {
            let affinity = b.options.affinity.is_some();
            for s in &b.servers {
                let text = match last.next() {
                    Some((a, was, text)) if a == affinity && was == *s => text,
                    _ => server_text(b, s),
                };
                out.push_str(&text);
                out.push_str(parts.next()?);
                self.texts.push((affinity, s.clone(), text));
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::ingress::fixture::model;
    use crate::template::render_cfg;

    #[test]
    fn filled_with_its_own_model_it_is_the_templates_output() {
        let m = model(include_str!("../tests/fixtures/canary.yaml"));
        let t = Templates::default();
        let full = render_cfg(&m, &t).unwrap();
        let mut s = Skeleton::cut(&m, &t, &full).unwrap().expect("the built-in template cuts");
        assert_eq!(s.parts.len(), m.backends.iter().map(|b| b.servers.len()).sum::<usize>() + 1);
        assert_eq!(s.fill(&m, &t).as_deref(), Some(full.as_str()));
    }

    #[test]
    fn a_moved_endpoint_fills_as_the_template_renders_it() {
        let mut m = model(include_str!("../tests/fixtures/basic.yaml"));
        let t = Templates::default();
        let mut s = Skeleton::cut(&m, &t, &render_cfg(&m, &t).unwrap()).unwrap().unwrap();
        let server = &mut m.backends[0].servers[0];
        server.endpoint = Some("10.1.2.3:8080".parse().unwrap());
        server.draining = true;
        m.backends[0].servers[1].endpoint = None;
        assert_eq!(s.fill(&m, &t), Some(render_cfg(&m, &t).unwrap()));
        // And back: the texts kept of the last fill are written again only for the very same
        // server.
        let back = model(include_str!("../tests/fixtures/basic.yaml"));
        assert_eq!(s.fill(&back, &t), Some(render_cfg(&back, &t).unwrap()));
    }

    #[test]
    fn another_shape_or_template_has_none() {
        let m = model(include_str!("../tests/fixtures/basic.yaml"));
        let t = Templates::default();
        let full = render_cfg(&m, &t).unwrap();
        let mut s = Skeleton::cut(&m, &t, &full).unwrap().unwrap();
        let mut grown = m.clone();
        let mut extra = grown.backends[0].servers[0].clone();
        extra.name = "SRV_999".into();
        grown.backends[0].servers.push(extra);
        assert_eq!(s.fill(&grown, &t), None, "a server more: the template must run");
        let mut renamed = m.clone();
        renamed.backends[0].name.push('x');
        assert_eq!(s.fill(&renamed, &t), None);
        let snippets = Templates {
            snippets: crate::template::Snippets { backend: "  # x".into(), ..Default::default() },
            ..Templates::default()
        };
        assert_eq!(s.fill(&m, &snippets), None, "other snippets: the template must run");
        let own = Templates { main: Some(crate::template::BUILTIN.to_string()), ..Templates::default() };
        assert_eq!(Skeleton::cut(&m, &own, &full).unwrap(), None, "an admin's template is always run");
        assert_eq!(Skeleton::cut(&m, &t, "other text").unwrap(), None, "a failed proof keeps nothing");
    }
}
