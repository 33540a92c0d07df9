//! Reading PTX text for the checks in `tests/ptx*.rs`: its functions, an
//! instruction's operands, and a divergence check that finds aligned
//! block barriers the lanes of a warp may reach at different instructions.

mod cfg;
mod divergence;
#[cfg(test)]
mod tests;

pub use divergence::{aligned_barriers_under_divergence, Class, Finding};

/// Every function (`.func` and `.entry`) of a module with a body: (name,
/// body from its opening `{` line to its closing `}` line).
pub fn functions(ptx: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(at) = ["\n.func ", "\n.visible .func ", "\n.weak .func ", "\n.visible .entry ", "\n.entry "]
        .iter()
        .filter_map(|h| rest.find(h).map(|i| (i, h.len())))
        .min()
    {
        let head = rest[at.0 + at.1..].trim_start();
        // Skip a return value list: `.func (.param .b32 func_retval0) name(`.
        let head = match head.strip_prefix('(') {
            Some(h) => h[h.find(')').unwrap() + 1..].trim_start(),
            None => head,
        };
        let name_len = head
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
            .unwrap_or(head.len());
        let name = &head[..name_len];
        rest = &head[name_len..];
        // A declaration ends in `;` before any body.
        let next_head = rest
            .find("\n.func ")
            .unwrap_or(rest.len())
            .min(rest.find("\n.visible ").unwrap_or(rest.len()));
        match rest.find("\n{\n") {
            Some(open) if open < next_head => {
                let body = &rest[open..];
                let end = body.find("\n}\n").map_or(body.len(), |e| e + 3);
                out.push((name, &body[..end]));
                rest = &body[end - 1..];
            }
            _ => {}
        }
    }
    out
}

/// The operands of an instruction (`op a, [b], {c, d}` → `a`, `[b]`, `{c, d}`).
pub fn operands(ins: &str) -> Vec<String> {
    let Some((_, rest)) = ins.split_once(char::is_whitespace) else {
        return Vec::new();
    };
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0);
    for c in rest.chars() {
        match c {
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur.trim().to_string());
    out
}
