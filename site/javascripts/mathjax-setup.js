// MathJax 3, configured as Jupyter renders math ($...$ inline, $$...$$ display), loaded from the copy that
// the site ships next to this file, so that formulas render without any network.
window.MathJax = {
  loader: {load: ["[tex]/textmacros"]},  // \text{BLOCK\_M}, as JupyterLab renders it
  tex: {
    packages: {"[+]": ["textmacros"]},
    inlineMath: [["$", "$"], ["\\(", "\\)"]],
    displayMath: [["$$", "$$"], ["\\[", "\\]"]],
    processEscapes: true,
  },
};
(function loadMathJax() {
  const script = document.createElement("script");
  script.src = new URL("mathjax/tex-chtml.js", document.currentScript.src).href;
  script.async = true;
  document.head.appendChild(script);
})();
